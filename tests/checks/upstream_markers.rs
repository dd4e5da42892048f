//! docs/upstream.md against the code: every entry of its "Differences from upstream, on purpose"
//! starts with an id, `<a id="differs-<id>"></a>`, and a comment at the code that makes the
//! difference names it, `[differs: <id>]`. An entry without an id, an id given twice, an entry no
//! comment names and a marker that names no entry all fail, so a difference cannot be added to the
//! code or dropped from it without the page saying so. Markers are looked for in every text file
//! git lists (tracked, or new and not ignored) but the documentation, CHANGELOG.md, the tests and
//! the protos.
use std::collections::{BTreeMap, BTreeSet};
use std::io::ErrorKind;
use std::path::Path;
use std::process::Command;

use integration_tests::root;

const PAGE: &str = "docs/upstream.md";
const SECTION: &str = "## Differences from upstream, on purpose";
const ANCHOR: &str = "<a id=\"differs-";
const MARKER: &str = "[differs:";

/// Files whose markers do not count: the documentation (the page among it) and the changelog
/// describe the differences rather than make them, the tests' fixtures name ids of their own, and
/// the protos are upstream's.
fn skipped(path: &str) -> bool {
    path.starts_with("docs/") || path == "CHANGELOG.md" || path.starts_with("tests/") || path.ends_with(".proto")
}

/// An id as the page and the markers write it (without `differs-`): lower-case words joined by `-`.
fn valid_id(id: &str) -> bool {
    let word = |w: &str| !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    id.split('-').all(word)
}

/// The entries of the page's Differences section (from its heading to the next `## ` heading),
/// by id with their line, and what is wrong with the section: a top-level bullet that does not
/// start with its anchor, an id given twice or malformed, no section at all.
fn page_entries(page: &str) -> (BTreeMap<String, usize>, Vec<String>) {
    let (mut ids, mut problems) = (BTreeMap::new(), Vec::new());
    let mut lines = page.lines().zip(1..);
    if !lines.any(|(line, _)| line.trim_end() == SECTION) {
        problems.push(format!("{PAGE}: no \"{SECTION}\" heading"));
        return (ids, problems);
    }
    let mut fenced = false;
    for (line, number) in lines.take_while(|(line, _)| !line.starts_with("## ")) {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced {
            continue;
        }
        if line.starts_with("- ") && !line["- ".len()..].starts_with(ANCHOR) {
            problems.push(format!("{PAGE}:{number}: an entry that does not start with its id: {line}"));
        }
        for (at, _) in line.match_indices(ANCHOR) {
            let rest = &line[at + ANCHOR.len()..];
            let id = rest.split('"').next().unwrap_or_default();
            if !valid_id(id) || !rest[id.len()..].starts_with('"') {
                problems.push(format!("{PAGE}:{number}: a malformed id: {}", &line[at..]));
            } else if let Some(first) = ids.insert(id.to_owned(), number) {
                problems.push(format!("{PAGE}:{number}: differs-{id} is given twice (first at line {first})"));
                ids.insert(id.to_owned(), first);
            }
        }
    }
    if ids.is_empty() && problems.is_empty() {
        problems.push(format!("{PAGE}: no entry in \"{SECTION}\""));
    }
    (ids, problems)
}

/// The markers of `text`, by line: the id as written, or `None` when the marker is not closed on
/// its line.
fn markers(text: &str) -> Vec<(usize, Option<&str>)> {
    text.lines()
        .zip(1..)
        .flat_map(|(line, number)| {
            line.match_indices(MARKER).map(move |(at, _)| {
                let rest = &line[at + MARKER.len()..];
                (number, rest.find(']').map(|end| rest[..end].trim()))
            })
        })
        .collect()
}

/// Everything that does not match between the page and the sources ((path, text) pairs), one line
/// each: the page's own problems, markers that are malformed or name no entry, and entries no
/// marker names. Empty when every entry has a marker and every marker an entry.
fn mismatches(page: &str, sources: &[(String, String)]) -> Vec<String> {
    let (entries, mut found) = page_entries(page);
    let mut named = BTreeSet::new();
    for (path, text) in sources {
        for (number, id) in markers(text) {
            match id {
                Some(id) if entries.contains_key(id) => {
                    named.insert(id);
                }
                Some(id) if valid_id(id) => {
                    found.push(format!("{path}:{number}: [differs: {id}] names no entry of {PAGE}"));
                }
                Some(id) => found.push(format!(
                    "{path}:{number}: a malformed marker [differs: {id}] (an id is lower-case words joined by -)"
                )),
                None => found.push(format!("{path}:{number}: a marker without its closing ]")),
            }
        }
    }
    for (id, number) in &entries {
        if !named.contains(id.as_str()) {
            found.push(format!("{PAGE}:{number}: differs-{id} has no [differs: {id}] in the code"));
        }
    }
    found
}

/// The text files of the repository at `root` that may hold markers, by path relative to it: what
/// `git ls-files` lists (new files not ignored too, so an uncommitted marker counts), but the
/// skipped ones. A file that is not UTF-8 holds no comment to read; one listed but gone from the
/// working tree, or a directory (a submodule), is passed over.
fn sources(root: &Path) -> Vec<(String, String)> {
    let listed = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["ls-files", "-z", "--cached", "--others", "--exclude-standard"])
        .output()
        .expect("running git ls-files");
    assert!(listed.status.success(), "git ls-files: {}", String::from_utf8_lossy(&listed.stderr));
    let paths = String::from_utf8_lossy(&listed.stdout);
    let mut found = Vec::new();
    for path in paths.split('\0').filter(|p| !p.is_empty() && !skipped(p)) {
        match std::fs::read(root.join(path)) {
            Ok(bytes) => {
                if let Ok(text) = String::from_utf8(bytes) {
                    found.push((path.to_owned(), text));
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::IsADirectory) => {}
            Err(e) => panic!("reading {path}: {e}"),
        }
    }
    found
}

#[test]
fn every_difference_from_upstream_is_marked_in_the_code_and_every_marker_names_one() {
    let root = root();
    let page = std::fs::read_to_string(root.join(PAGE)).expect("reading docs/upstream.md");
    let sources = sources(&root);
    // The walk reached the code: the manager's and the sidecar's sources were read.
    for crate_src in ["operator/src/", "sidecar/src/"] {
        assert!(sources.iter().any(|(path, _)| path.starts_with(crate_src)), "no file of {crate_src} was read");
    }
    let found = mismatches(&page, &sources);
    assert!(found.is_empty(), "{PAGE} and the code disagree:\n{}", found.join("\n"));
}

fn write(dir: &Path, file: &str, text: &str) {
    let path = dir.join(file);
    std::fs::create_dir_all(path.parent().expect("a file in a directory")).expect("creating the directory");
    std::fs::write(path, text).expect("writing the file");
}

#[test]
fn an_entry_no_code_names_and_a_marker_naming_no_entry_are_reported() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let tree = dir.path();
    let init = Command::new("git").arg("-C").arg(tree).args(["init", "-q"]).output().expect("running git init");
    assert!(init.status.success(), "git init: {}", String::from_utf8_lossy(&init.stderr));
    let page = "# Upstream\n\n## Differences from upstream, on purpose\n\n### The manager\n\n\
                - <a id=\"differs-one-thing\"></a>does one thing (upstream: the other);\n\
                - <a id=\"differs-another\"></a>does another,\n  over two lines.\n\n\
                ## Elsewhere\n\n- a bullet of another section needs no id.\n";
    write(tree, PAGE, page);
    write(tree, "src/lib.rs", "/// Does one thing (upstream: the other). [differs: one-thing]\npub fn one() {}\n");
    // Where markers do not count: the documentation, the changelog, the tests, a file not UTF-8,
    // and one git ignores.
    write(tree, "docs/other.md", "[differs: another]\n");
    write(tree, "CHANGELOG.md", "- [differs: another]\n");
    write(tree, "tests/fixture.rs", "// [differs: another]\n");
    std::fs::write(tree.join("image.bin"), b"\xff\xfe [differs: another]\n").expect("writing image.bin");
    write(tree, ".gitignore", "target/\n");
    write(tree, "target/build.rs", "// [differs: another]\n");

    let read = |page: &str| mismatches(page, &sources(tree));
    assert_eq!(read(page), [format!("{PAGE}:8: differs-another has no [differs: another] in the code")]);

    // A marker naming an entry the page does not have is reported too, where it is.
    write(tree, "deploy/manager.yaml", "# Does another. [differs: another]\n# [differs: a-third]\nkind: Pod\n");
    assert_eq!(read(page), ["deploy/manager.yaml:2: [differs: a-third] names no entry of docs/upstream.md"]);

    // With a marker for each entry and no other, nothing is reported.
    write(tree, "deploy/manager.yaml", "# Does another. [differs: another]\nkind: Pod\n");
    assert_eq!(read(page), Vec::<String>::new());
}

#[test]
fn an_entry_without_an_id_an_id_given_twice_and_a_malformed_marker_are_reported() {
    let page = "## Differences from upstream, on purpose\n\n\
                - <a id=\"differs-twice\"></a>does one thing;\n\
                - does a thing without an id;\n\
                - <a id=\"differs-twice\"></a>does another.\n";
    let sources =
        [("src/lib.rs".to_owned(), "// [differs: twice]\n// [differs: Not_An_Id]\n// [differs: open\n".to_owned())];
    assert_eq!(
        mismatches(page, &sources),
        [
            "docs/upstream.md:4: an entry that does not start with its id: - does a thing without an id;",
            "docs/upstream.md:5: differs-twice is given twice (first at line 3)",
            "src/lib.rs:2: a malformed marker [differs: Not_An_Id] (an id is lower-case words joined by -)",
            "src/lib.rs:3: a marker without its closing ]",
        ]
    );
}
