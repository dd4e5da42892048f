#!/usr/bin/env python3
"""Checks that every relative link in the repository's Markdown resolves.

For each Markdown file git tracks (or those named), each link `[text](target)` or reference
definition `[label]: target` whose target is not a URL must name a file or folder of the
repository, and a `#fragment` must name a heading of the Markdown file it points at (GitHub's
anchors: lower case, punctuation dropped, spaces to hyphens, a repeated heading suffixed -1, -2…).
Links inside code blocks and code spans are not links. Exits 1, listing each broken link with its
file and line, if any is broken.

Usage: hack/check-links.py [FILE.md...]
"""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INLINE = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
FENCE = re.compile(r"^\s{0,3}(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")


def markdown_files(named):
    if named:
        return [Path(n).resolve() for n in named]
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / line for line in listed.stdout.splitlines() if line]


def prose_lines(text):
    """(number, line) for each line outside fenced code blocks, code spans blanked."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        opened = FENCE.match(line)
        if fence:
            if opened and opened.group(1) == fence:
                fence = None
            continue
        if opened:
            fence = opened.group(1)
            continue
        yield number, CODE_SPAN.sub("", line)


def anchors(path):
    """The anchors GitHub gives the headings of the Markdown file at path."""
    seen, found = {}, set()
    for _, line in prose_lines(path.read_text(errors="replace")):
        heading = re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1))
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    # Headings whose code spans were blanked above are matched with their text as well.
    for line in path.read_text(errors="replace").splitlines():
        heading = re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            found.add(re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-"))
    return found


def broken_links(path):
    text = path.read_text(errors="replace")
    for number, line in prose_lines(text):
        targets = [m.group(1) for m in INLINE.finditer(line)]
        definition = DEFINITION.match(line)
        if definition:
            targets.append(definition.group(1))
        for target in targets:
            if URL.match(target):
                continue
            file_part, _, fragment = target.partition("#")
            resolved = (path.parent / file_part).resolve() if file_part else path
            if not resolved.exists():
                yield number, target, "no such file"
            elif fragment and resolved.suffix == ".md" and fragment.lower() not in anchors(resolved):
                yield number, target, f"no heading with the anchor #{fragment} in {resolved.relative_to(ROOT)}"


def main(argv):
    failures = 0
    files = markdown_files(argv)
    for path in files:
        for number, target, why in broken_links(path):
            print(f"{path.relative_to(ROOT)}:{number}: {target}: {why}")
            failures += 1
    if failures:
        print(f"check-links: {failures} broken relative links", file=sys.stderr)
        return 1
    print(f"check-links: {len(files)} Markdown files, every relative link resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
