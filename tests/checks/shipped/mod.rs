//! Checks of the shipped build itself (`make ship-binaries`: static for musl, the `ship` profile's
//! fat LTO): what its profile makes of the reconcile futures, and how its linker lays out the code.
//! Ignored by `make test`, whose builds are the debug ones; `make test-shipped` builds the shipped
//! binaries and runs them, and CI runs that as a tier of its own (`shipped`). On two cores the
//! shipped build costs more than the rest of `make test` together when nothing is cached.
use std::path::PathBuf;

mod code_order;
mod future_sizes;

/// The shipped build's `future_sizes` example, named by FUTURE_SIZES (`make test-shipped`); its
/// folder's parent is where the shipped binaries and their link figures are.
fn future_sizes_probe() -> PathBuf {
    let Some(probe) = std::env::var_os("FUTURE_SIZES").filter(|p| !p.is_empty()) else {
        panic!(
            "FUTURE_SIZES is unset: run `make test-shipped`, which builds the shipped binaries and names their futures' size probe"
        )
    };
    let probe = PathBuf::from(probe);
    assert!(probe.is_file(), "{}: no such file: `make ship-binaries` builds it", probe.display());
    probe
}
