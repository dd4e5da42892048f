//! The shipped builds' linker (hack/link-ordered.sh): it links with the toolchain's LLD and puts the
//! functions build/code-order/<binary>.txt lists first, in the list's order; and the lists still
//! name the functions of the binaries `make ship-binaries` built.
use std::path::{Path, PathBuf};
use std::process::Command;

use integration_tests::root;

fn run(command: &mut Command) -> String {
    let output = command.output().unwrap_or_else(|e| panic!("running {command:?}: {e}"));
    assert!(output.status.success(), "{command:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The Rust target the shipped binaries are built for on this machine.
fn ship_target() -> String {
    run(&mut Command::new(root().join("hack/static-target.sh"))).trim().to_owned()
}

#[test]
#[ignore = "the shipped build's: make test-shipped"]
fn listed_functions_come_first_in_the_listed_order_and_the_program_is_unchanged() {
    // The script finds its list relative to itself: a tree of its own with a list for `probe`.
    let tree = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tree.path().join("hack")).unwrap();
    std::fs::create_dir_all(tree.path().join("build/code-order")).unwrap();
    let linker = tree.path().join("hack/link-ordered.sh");
    std::fs::copy(root().join("hack/link-ordered.sh"), &linker).unwrap();
    // A Rust function (listed without its hash), an unmangled one, a C-like name the objects lack
    // (taken to be an archive's: not counted) and a Rust function the program lacks (counted).
    std::fs::write(
        tree.path().join("build/code-order/probe.txt"),
        "_ZN5probe6second\nfirst\nnot_in_the_program\n_ZN5probe4gone17h0123456789abcdefE\n",
    )
    .unwrap();
    let source = tree.path().join("probe.rs");
    std::fs::write(
        &source,
        "#[inline(never)] #[unsafe(no_mangle)] pub fn first(x: u64) -> u64 { x.wrapping_mul(31) ^ 7 }\n\
         #[inline(never)] pub fn second(x: u64) -> u64 { x.rotate_left(5) + 3 }\n\
         fn main() { let n = std::env::args().count() as u64; println!(\"{}\", first(n) + second(n)); }\n",
    )
    .unwrap();
    // Named as cargo names a binary before copying it out of deps/.
    let binary = tree.path().join("probe-0123456789abcdef");
    run(Command::new("rustc")
        .args(["-O", "-C", "codegen-units=1", "-C", "lto=fat", "--target", &ship_target()])
        .arg(format!("-Clinker={}", linker.display()))
        .arg("-o")
        .arg(&binary)
        .arg(&source));

    // first(2) + second(2) = (62 ^ 7) + (64 + 3)
    assert_eq!(run(Command::new(&binary).arg("x")).trim(), "124");
    let comment = run(Command::new("readelf").args(["-p", ".comment"]).arg(&binary));
    assert!(comment.contains("Linker: LLD"), "not linked by LLD:\n{comment}");
    let text: Vec<String> = run(Command::new("nm").arg("-n").arg(&binary))
        .lines()
        .filter(|l| matches!(l.split_whitespace().nth(1), Some("t" | "T")))
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_owned))
        .collect();
    assert!(
        text.len() > 2 && text[0].starts_with("_ZN5probe6second17h") && text[1] == "first",
        "the listed functions are not first: {:?}",
        &text[..text.len().min(5)]
    );
    // Counted: second, first and gone; found: second and first.
    let stats = std::fs::read_to_string(tree.path().join("probe-0123456789abcdef.code-order")).unwrap();
    assert_eq!(stats.trim(), "listed 3 found 2");
}

/// The `.code-order` figures the linker left beside the newest link of `binary` in `deps`.
fn newest_stats(deps: &Path, binary: &str) -> Option<(PathBuf, usize, usize)> {
    let prefix = format!("{}-", binary.replace('-', "_"));
    let newest = std::fs::read_dir(deps)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "code-order"))
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&prefix)))
        .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())?;
    let text = std::fs::read_to_string(&newest).ok()?;
    let numbers: Vec<usize> = text.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    match numbers[..] {
        [listed, found] => Some((newest, listed, found)),
        _ => None,
    }
}

#[test]
#[ignore = "the shipped build's: make test-shipped"]
fn the_code_order_lists_name_the_shipped_binaries_functions() {
    let probe = super::future_sizes_probe();
    // target/<triple>/ship/examples/future_sizes: two levels up is the shipped build's folder.
    let ship = probe.parent().and_then(Path::parent).map(Path::to_path_buf).unwrap();
    if ship_target().ends_with("-gnu") {
        // The glibc stand-in links with rustc's own defaults: there is nothing of the order to check.
        return;
    }
    for binary in ["csi-addons-manager", "csi-addons-sidecar"] {
        let (stats, listed, found) = newest_stats(&ship.join("deps"), binary)
            .unwrap_or_else(|| panic!("no .code-order figures for {binary} in {}", ship.join("deps").display()));
        // A list made for an older build keeps most names; under nine in ten found means the code
        // moved on: run hack/code-order.sh again.
        assert!(
            listed > 1000 && found * 10 >= listed * 9,
            "{}: {found} of {listed} listed functions found; run hack/code-order.sh",
            stats.display()
        );
    }
}
