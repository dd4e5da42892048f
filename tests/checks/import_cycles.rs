//! `hack/import-cycles.py`, which `make lint` runs on every crate of the workspace: it finds a circle
//! where there is one, says which names tie it, lets a parent hand on its own child's names, and finds
//! none in any crate.
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn scan(src: &Path) -> Output {
    Command::new("python3").arg(repository().join("hack/import-cycles.py")).arg(src).output().unwrap()
}

fn write(dir: &Path, file: &str, text: &str) {
    let path = dir.join(file);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

#[test]
fn a_circle_through_use_lines_and_paths_is_found_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    write(src, "lib.rs", "pub mod core;\npub mod controllers;\n");
    write(src, "core/mod.rs", "pub mod status;\n");
    // A leaf that reaches back up into a controller closes the circle.
    write(
        src,
        "core/status.rs",
        "// crate::controllers::node is only named in a comment\npub fn set() { crate::controllers::node::run(); }\n",
    );
    write(src, "controllers/mod.rs", "pub mod node;\n");
    write(src, "controllers/node.rs", "use crate::core::status::set;\npub fn run() { let _ = \"super::nothing\"; }\n");
    let found = scan(src);
    let report = String::from_utf8_lossy(&found.stdout);
    assert_eq!(found.status.code(), Some(1), "{report}");
    assert!(report.contains("core/status.rs -> ") && report.contains("controllers/node.rs: run"), "{report}");
    assert!(report.contains("controllers/node.rs -> ") && report.contains("core/status.rs: set"), "{report}");

    // The same files without the back reference: `mod` lines alone are the layout, not a circle.
    write(src, "core/status.rs", "pub fn set() {}\n");
    let clean = scan(src);
    assert_eq!(clean.status.code(), Some(0), "{}", String::from_utf8_lossy(&clean.stdout));
}

#[test]
fn no_crate_of_the_workspace_has_a_circle() {
    let scanned = Command::new("python3")
        .arg(repository().join("hack/import-cycles.py"))
        .arg("--workspace")
        .arg(repository())
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&scanned.stdout);
    assert!(scanned.status.success(), "{report}{}", String::from_utf8_lossy(&scanned.stderr));
    // Every crate's sources were read: the libraries and binaries, and each test binary.
    for src in [
        "api/src",
        "operator/src",
        "sidecar/src",
        "driver/src",
        "driver-operator/src",
        "testenv/src",
        "demo/src",
        "tests/integration",
        "tests/cluster",
    ] {
        assert!(report.contains(&format!("{src}: ")), "{src} was not scanned:\n{report}");
    }
}

#[test]
fn a_parent_handing_on_its_childs_names_is_no_circle_but_importing_them_is() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    write(src, "lib.rs", "pub mod kinds;\n");
    write(src, "kinds/mod.rs", "mod fence;\npub use fence::{Fence, FenceSpec as Spec};\npub struct Outcome;\n");
    write(src, "kinds/fence.rs", "use super::Outcome;\npub struct Fence(Outcome);\npub struct FenceSpec;\n");
    let reexported = scan(src);
    assert_eq!(reexported.status.code(), Some(0), "{}", String::from_utf8_lossy(&reexported.stdout));

    // The parent using the child's item itself, not only handing it on, closes the circle.
    write(
        src,
        "kinds/mod.rs",
        "mod fence;\npub use fence::Fence;\npub struct Outcome;\npub fn f(_: fence::FenceSpec) {}\n",
    );
    let used = scan(src);
    let report = String::from_utf8_lossy(&used.stdout);
    assert_eq!(used.status.code(), Some(1), "{report}");
    assert!(report.contains("kinds/mod.rs -> ") && report.contains("kinds/fence.rs: FenceSpec"), "{report}");
}

#[test]
fn slashes_in_strings_and_quotes_in_comments_do_not_hide_paths() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    write(src, "lib.rs", "pub mod a;\npub mod b;\n");
    // `"unix://"` once read as the start of a comment, hiding the path after it on the line.
    write(src, "a.rs", "pub fn f() { let _ = (\"unix://x\", crate::b::g()); }\n");
    write(src, "b.rs", "// it's \"quoted\nfn h() {}\npub fn g() { let _ = ('\\'', r#\"//\"#, crate::a::f); }\n");
    let found = scan(src);
    let report = String::from_utf8_lossy(&found.stdout);
    assert_eq!(found.status.code(), Some(1), "{report}");
    assert!(report.contains("a.rs: f") && report.contains("b.rs: g"), "{report}");
}

#[test]
fn nested_groups_and_globs_are_edges_too() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    write(src, "lib.rs", "pub mod a;\npub mod b;\n");
    write(src, "a/mod.rs", "pub mod x;\nuse crate::{b::{g, self}};\n");
    write(src, "a/x.rs", "use super::*;\npub fn y() {}\n");
    write(src, "b.rs", "pub fn g() { crate::a::x::y(); }\n");
    // A binary beside the library is a crate of its own: not part of the circle.
    write(src, "main.rs", "fn main() { csi::a::x::y(); }\n");
    write(src, "bin/tool.rs", "fn main() { crate::b::g(); }\n");
    let found = scan(src);
    let report = String::from_utf8_lossy(&found.stdout);
    assert_eq!(found.status.code(), Some(1), "{report}");
    assert!(report.contains("import circle of 3 files"), "{report}");
    assert!(report.contains("a/x.rs -> ") && report.contains("a/mod.rs: *"), "{report}");
    assert!(report.contains("a/mod.rs -> ") && report.contains("b.rs: b, g"), "{report}");
    assert!(!report.contains("main.rs") && !report.contains("tool.rs"), "{report}");
}
