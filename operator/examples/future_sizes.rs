//! Prints each reconcile future's size in bytes, one `name size` line per controller. Built in
//! the shipped binary's profile by `make test` (`make ship-binaries`, the `ship` profile), where the sizes that count
//! are laid out, and read by the integration test that bounds them.
fn main() {
    for (name, size) in operator::future_sizes::reconcile_futures() {
        println!("{name} {size}");
    }
}
