//! Writes every CRD to `<dir>/<group>_<plural>.yaml` (default `config/crd/bases`) and the driver
//! operator's to `<driver-dir>` (default `driver-operator/config/crd/bases`), or with `--check`
//! fails if the committed files differ from what the types generate.
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut check = false;
    let mut dir = PathBuf::from("config/crd/bases");
    let mut driver_dir = PathBuf::from("driver-operator/config/crd/bases");
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--check" => check = true,
            "--dir" => match args.next() {
                Some(d) => dir = PathBuf::from(d),
                None => return fail("--dir needs a value"),
            },
            "--driver-dir" => match args.next() {
                Some(d) => driver_dir = PathBuf::from(d),
                None => return fail("--driver-dir needs a value"),
            },
            "--help" | "-h" => {
                println!("usage: crdgen [--dir DIR] [--driver-dir DIR] [--check]");
                return ExitCode::SUCCESS;
            }
            other => return fail(&format!("unknown argument {other:?}; see --help")),
        }
    }
    let mut stale = Vec::new();
    let sets = [(dir, api::crds::all()), (driver_dir, api::crds::driver_operator())];
    for (dir, crd) in sets.iter().flat_map(|(dir, crds)| crds.iter().map(move |crd| (dir, crd))) {
        let path = dir.join(api::crds::file_name(crd));
        let yaml = match api::crds::to_yaml(crd) {
            Ok(y) => y,
            Err(e) => return fail(&format!("{}: {e}", path.display())),
        };
        if check {
            if std::fs::read_to_string(&path).ok().as_deref() != Some(yaml.as_str()) {
                stale.push(path.display().to_string());
            }
        } else if let Err(e) = std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, yaml)) {
            return fail(&format!("{}: {e}", path.display()));
        }
    }
    if !stale.is_empty() {
        return fail(&format!("out of date (run `make manifests`): {}", stale.join(", ")));
    }
    ExitCode::SUCCESS
}

fn fail(message: &str) -> ExitCode {
    eprintln!("crdgen: {message}");
    ExitCode::FAILURE
}
