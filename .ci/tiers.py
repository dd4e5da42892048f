#!/usr/bin/env python3
"""Runs CI's suites (.ci/suites.toml) in tiers within a time budget, and prints what ran.

  tiers.py run                 the core suites, then each other tier whose recorded cost fits in
                               what is left of the budget (CI_RUN_START: when the run began, in
                               seconds since the epoch; now if unset)
  tiers.py run --all           every tier, whatever the time (make test-all)
  tiers.py run --only A,B      only these tiers, whatever the time (make test-cluster, test-olm)
  tiers.py table               the Markdown table of the suites, as CONTRIBUTING.md shows it
  tiers.py check-doc FILE      fail if FILE's table differs from `table`

A suite that fails fails the run, and the run goes on with the others: a later tier is left out only
for time, and the last lines say which ran, which failed and which were not run for time, with the
closing line `tests: N passed, N failed, N skipped` over every cargo test binary.
"""

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CARGO_KEY = ""  # set by main: cargo_key() runs rustc and cargo
SUITES = ROOT / ".ci" / "suites.toml"
CACHE = Path(os.environ.get("CSI_ADDONS_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "csi-addons-rs")
STAMPS = CACHE / "ci" / "passed"
TABLE_BEGIN = "<!-- tiers: begin (generated from .ci/suites.toml by `python3 .ci/tiers.py table`) -->"
TABLE_END = "<!-- tiers: end -->"


def load():
    with open(SUITES, "rb") as f:
        spec = tomllib.load(f)
    clusters = spec.get("cluster", {})
    names = set()
    for suite in spec["suite"]:
        for key in ("name", "what", "command", "cold_s", "warm_s"):
            if key not in suite:
                sys.exit(f"tiers: {SUITES}: a suite lacks '{key}': {suite}")
        if suite["name"] in names:
            sys.exit(f"tiers: {SUITES}: two suites are named {suite['name']}")
        if suite.get("cluster") and suite["cluster"] not in clusters:
            sys.exit(f"tiers: {SUITES}: {suite['name']} runs on cluster {suite['cluster']}, which is not described")
        for before in suite.get("after", []) + clusters.get(suite.get("cluster"), {}).get("after", []):
            if before not in names:
                sys.exit(f"tiers: {SUITES}: {suite['name']} comes after {before}, which is not listed before it")
        names.add(suite["name"])
    core = [s for s in spec["suite"] if s.get("core")]
    if spec["suite"][: len(core)] != core:
        sys.exit(f"tiers: {SUITES}: the core suites come first")
    return spec["budget_s"], spec["suite"], clusters


def cargo_key():
    """What decides whether cargo's cached output serves a build (.ci/run keys its cache alike)."""
    digest = hashlib.sha256()
    for command in (["rustc", "-vV"], ["cargo", "-V"]):
        digest.update(subprocess.run(command, capture_output=True, check=True).stdout)
    for name in ("Cargo.lock", ".cargo/config.toml"):
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()


def stamp_key(item):
    """What a warm stamp must match: the scripts that build what the item needs, and cargo's key
    unless the item says its Rust builds are the ones the suites before it made (`cargo = false`)."""
    digest = hashlib.sha256(CARGO_KEY.encode() if item.get("cargo", True) else b"")
    for name in item.get("inputs", []):
        digest.update(name.encode() + b"\0")
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()


def stamp_path(kind, name):
    return STAMPS / f"{kind}-{name}"


def is_warm(kind, item):
    path = stamp_path(kind, item["name"])
    return path.exists() and path.read_text().strip() == stamp_key(item)


def mark_warm(kind, item):
    path = stamp_path(kind, item["name"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(stamp_key(item) + "\n")


def cost(kind, item):
    """The recorded cost of item on this machine now, and whether that is its warm figure."""
    warm = is_warm(kind, item)
    return (item["warm_s"] if warm else item["cold_s"]), warm


def minutes(seconds):
    return f"{seconds / 60:.1f} min"


class Run:
    def __init__(self, budget, suites, clusters, log):
        self.budget = budget
        self.suites = suites
        self.clusters = clusters
        self.log = log
        start = os.environ.get("CI_RUN_START")
        self.start = float(start) if start else time.time()
        self.results = {}  # name -> (outcome, line)
        self.took = {}  # name -> seconds, for the suites that ran
        self.failed = False
        self.up = None  # the name of the cluster running, if any

    def left(self):
        return self.budget - (time.time() - self.start)

    def shell(self, title, command):
        """Runs command through bash, its output to ours and to the log; its exit status."""
        print(f"ci: == {title}: {command}", flush=True)
        with open(self.log, "a") as log:
            process = subprocess.Popen(
                ["bash", "-o", "pipefail", "-c", command],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
            for raw in process.stdout:
                sys.stdout.buffer.write(raw)
                sys.stdout.flush()
                log.write(raw.decode(errors="replace"))
            return process.wait()

    def timed(self, title, command):
        began = time.time()
        status = self.shell(title, command)
        return status, time.time() - began

    def stop_cluster(self):
        if self.up is None:
            return
        name, self.up = self.up, None
        status, took = self.timed(f"stop cluster {name}", self.clusters[name]["stop"])
        if status != 0:
            self.failed = True
            print(f"ci: stopping cluster {name} failed (exit {status}): something of it was left", flush=True)
        print(f"ci: cluster {name} stopped in {took:.0f} s", flush=True)

    def start_cluster(self, name):
        """Starts the named cluster, stopping another first; false if it did not come up."""
        if self.up == name:
            return True
        self.stop_cluster()
        cluster = dict(self.clusters[name], name=name)
        status, took = self.timed(f"start cluster {name}", cluster["start"])
        # Whatever it got to, it is stopped at the end, and traces it left fail the run.
        self.up = name
        if status != 0:
            print(f"ci: cluster {name} did not start (exit {status}) after {took:.0f} s", flush=True)
            self.stop_cluster()
            return False
        mark_warm("cluster", cluster)
        print(f"ci: cluster {name} started in {took:.0f} s", flush=True)
        return True

    def needed(self, suite):
        """The recorded cost of running suite now: its own, plus its cluster's start if not running."""
        own, warm = cost("suite", suite)
        total, parts = own, [f"{own} s {'warm' if warm else 'cold'}"]
        name = suite.get("cluster")
        if name and self.up != name:
            start, start_warm = cost("cluster", dict(self.clusters[name], name=name))
            total += start
            parts.append(f"cluster {name}'s start {start} s {'warm' if start_warm else 'cold'}")
        return total, " + ".join(parts)

    def run_suite(self, suite, timed_out_ok, only):
        name = suite["name"]
        after = suite.get("after", []) + self.clusters.get(suite.get("cluster"), {}).get("after", [])
        selected = [b for b in after if only is None or b in only]
        missing = [b for b in selected if self.results.get(b, ("",))[0] not in ("ran", "failed")]
        if missing:
            why = "not run for time" if all(self.results.get(b, ("",))[0] == "not run for time" for b in missing) else "not run"
            self.results[name] = (why, f"{why}: it reads what {', '.join(missing)} did, which did not run")
            return
        need, parts = self.needed(suite)
        left = self.left()
        if timed_out_ok and need > left:
            self.results[name] = ("not run for time", f"not run for time: needs {need} s ({parts}), {max(left, 0):.0f} s left")
            return
        if suite.get("cluster") and not self.start_cluster(suite["cluster"]):
            self.failed = True
            self.results[name] = ("failed", f"failed: cluster {suite['cluster']} did not start")
            return
        status, took = self.timed(name, suite["command"])
        self.took[name] = took
        when = f"{took:.0f} s (recorded {parts}), {max(self.left(), 0):.0f} s of the budget left after it"
        if status == 0:
            mark_warm("suite", suite)
            self.results[name] = ("ran", f"ran: {when}")
        else:
            self.failed = True
            self.results[name] = ("failed", f"failed (exit {status}): {when}")

    def run(self, only, all_tiers):
        try:
            for suite in self.suites:
                if only is not None and suite["name"] not in only:
                    continue
                # The next tier's cluster differs from the one running: stop it first, so its cost
                # is not weighed against a tier that does not need it.
                if self.up and suite.get("cluster") != self.up:
                    self.stop_cluster()
                core = suite.get("core", False)
                self.run_suite(suite, not (core or all_tiers or only is not None), only)
        finally:
            self.stop_cluster()
        return self.report(only)

    def report(self, only):
        print(f"ci: tiers, in a budget of {minutes(self.budget)} from the start of the run:")
        for suite in self.suites:
            name = suite["name"]
            if only is not None and name not in only:
                continue
            tier = "core" if suite.get("core") else "tier"
            outcome = self.results.get(name, ("not run", "not run"))[1]
            print(f"ci:   {tier} {name:<16} {outcome}")
        core = [s["name"] for s in self.suites if s.get("core") and s["name"] in self.took]
        if core:
            print(f"ci: the core tier took {sum(self.took[n] for n in core):.0f} s ({minutes(sum(self.took[n] for n in core))})")
        return closing_line(self.log) and not self.failed


def closing_line(log):
    """Prints one closing line over every cargo test binary; false if no test passed."""
    passed = failed = ignored = 0
    pattern = re.compile(r"^test result: \S+\. (\d+) passed; (\d+) failed; (\d+) ignored")
    with open(log, errors="replace") as f:
        for line in f:
            m = pattern.match(line)
            if m:
                passed += int(m.group(1))
                failed += int(m.group(2))
                ignored += int(m.group(3))
    print(f"tests: {passed} passed, {failed} failed, {ignored} skipped", flush=True)
    return passed > 0


def table():
    budget, suites, clusters = load()
    rows = [
        f"Budget: {minutes(budget)} ({budget} s) from the start of `.ci/run`; CI's limit is 90 min.",
        "",
        "| Tier | Suite | Command | Cluster | Cold | Warm | What it covers |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in suites:
        tier = "core" if s.get("core") else "by time"
        cluster = s.get("cluster", "—")
        rows.append(f"| {tier} | {s['name']} | `{s['command']}` | {cluster} | {minutes(s['cold_s'])} | {minutes(s['warm_s'])} | {s['what']} |")
    rows += ["", "| Cluster start | Command | Cold | Warm | What it is |", "|---|---|---|---|---|"]
    for name, c in clusters.items():
        rows.append(f"| {name} | `{c['start']}` | {minutes(c['cold_s'])} | {minutes(c['warm_s'])} | {c['what']} |")
    core_cold = sum(s["cold_s"] for s in suites if s.get("core"))
    core_warm = sum(s["warm_s"] for s in suites if s.get("core"))
    every_warm = sum(s["warm_s"] for s in suites) + sum(c["warm_s"] for c in clusters.values())
    rows += [
        "",
        f"The core tier: {minutes(core_cold)} cold, {minutes(core_warm)} warm. Every tier, warm: {minutes(every_warm)}.",
    ]
    return "\n".join(rows)


def check_doc(path):
    text = Path(path).read_text()
    if TABLE_BEGIN not in text or TABLE_END not in text:
        sys.exit(f"tiers: {path} has no table between '{TABLE_BEGIN}' and '{TABLE_END}'")
    shown = text.split(TABLE_BEGIN, 1)[1].split(TABLE_END, 1)[0].strip()
    if shown != table():
        print(f"tiers: {path}'s CI table differs from .ci/suites.toml; put `python3 .ci/tiers.py table`'s output between its markers", file=sys.stderr)
        sys.exit(1)


def main(argv):
    if argv[:1] == ["table"]:
        print(table())
        return 0
    if argv[:1] == ["check-doc"] and len(argv) == 2:
        check_doc(argv[1])
        return 0
    if argv[:1] != ["run"]:
        print(__doc__, file=sys.stderr)
        return 2
    only = None
    all_tiers = "--all" in argv
    if "--only" in argv:
        i = argv.index("--only")
        if i + 1 >= len(argv):
            sys.exit("tiers: --only needs a comma-separated list of tiers")
        only = set(argv[i + 1].split(","))
    global CARGO_KEY
    CARGO_KEY = cargo_key()
    budget, suites, clusters = load()
    unknown = (only or set()) - {s["name"] for s in suites}
    if unknown:
        sys.exit(f"tiers: no such tier: {', '.join(sorted(unknown))}")
    with tempfile.NamedTemporaryFile(prefix="csi-addons-ci.", suffix=".log", delete=False) as f:
        log = f.name
    try:
        ok = Run(budget, suites, clusters, log).run(only, all_tiers)
    finally:
        os.unlink(log)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
