//! Upper bounds on the reconcile futures' sizes, as the shipped binaries' profile lays them out
//! (`operator/examples/future_sizes.rs`, built by `make test-shipped`). The manager's memory under load,
//! what `make bench` measures, grows with them: a change that makes one much larger fails here.
//! A bound is about one and a half times the size measured when it was set; raise it only with
//! a reason, and the benchmark figures, in the commit.
use std::collections::BTreeMap;

/// Bytes, per controller (measured 2026-11 in the `ship` profile for musl: 4608, 1208, 1208, 1376,
/// 1376, 2872, 3448, 2096, 5240, 11496 and 6256).
const BOUNDS: [(&str, usize); 11] = [
    ("csiaddonsnode", 7000),
    ("reclaimspacejob", 1800),
    ("encryptionkeyrotationjob", 1800),
    ("reclaimspacecronjob", 2100),
    ("encryptionkeyrotationcronjob", 2100),
    ("persistentvolumeclaim", 4300),
    ("networkfence", 5200),
    ("networkfenceclass", 3100),
    ("volumereplication", 7900),
    ("volumegroupreplication", 17200),
    ("volumegroupreplicationcontent", 9400),
];

fn measured() -> BTreeMap<String, usize> {
    let printer = super::future_sizes_probe();
    let output =
        std::process::Command::new(&printer).output().unwrap_or_else(|e| panic!("running {}: {e}", printer.display()));
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_once(' '))
        .map(|(name, size)| (name.to_owned(), size.parse().unwrap()))
        .collect()
}

#[test]
#[ignore = "the shipped build's: make test-shipped"]
fn every_reconcile_future_stays_within_its_bound() {
    let sizes = measured();
    let names: Vec<&str> = sizes.keys().map(String::as_str).collect();
    let bounded: Vec<&str> = {
        let mut b: Vec<&str> = BOUNDS.iter().map(|(name, _)| *name).collect();
        b.sort_unstable();
        b
    };
    assert_eq!(names, bounded, "every controller printed has a bound, and every bound a controller");
    let over: Vec<String> = BOUNDS
        .iter()
        .filter(|(name, bound)| sizes[*name] > *bound)
        .map(|(name, bound)| format!("{name}: {} bytes, bound {bound}", sizes[*name]))
        .collect();
    eprintln!("{sizes:#?}");
    assert!(over.is_empty(), "reconcile futures over their bounds:\n{}", over.join("\n"));
}
