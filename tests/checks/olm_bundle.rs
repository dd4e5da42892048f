//! The OLM bundle: `make bundle` regenerates bundle/ with no diff; operator-sdk's validators (the
//! operatorframework suite) find no error and no warning; scorecard's basic and OLM tests pass;
//! operator-sdk accepts the PROJECT file (and a broken one is caught); the CSV owns exactly the
//! bundled CRDs and describes every field of them.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use integration_tests::{root, test_peer};

/// The directory holding operator-sdk and scorecard-test (hack/operator-sdk.sh).
fn operator_sdk_dir() -> PathBuf {
    test_peer("OPERATOR_SDK_DIR", "operator-sdk.sh")
}

fn operator_sdk(cwd: &Path, args: &[&str]) -> Output {
    Command::new(operator_sdk_dir().join("operator-sdk")).args(args).current_dir(cwd).output().unwrap()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Every file under `dir`, by path relative to it, with its content.
fn files(dir: &Path) -> BTreeMap<PathBuf, String> {
    let mut found = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let relative = path.strip_prefix(dir).unwrap().to_path_buf();
                found.insert(relative, std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    found
}

#[test]
fn make_bundle_regenerates_the_committed_bundle_without_a_diff() {
    let out = tempfile::tempdir().unwrap();
    let made = Command::new("make")
        .args(["-s", "bundle"])
        .arg(format!("BUNDLE_OUT={}", out.path().display()))
        .current_dir(root())
        .output()
        .unwrap();
    assert!(made.status.success(), "make bundle: {}", text(&made));
    // The csi-addons bundle at the root, the driver operator's under driver-operator/.
    for dir in ["", "driver-operator"] {
        let mut committed = files(&root().join(dir).join("bundle"));
        committed.remove(Path::new("README.md"));
        let fresh = files(&out.path().join(dir).join("bundle"));
        assert_eq!(committed.keys().collect::<Vec<_>>(), fresh.keys().collect::<Vec<_>>(), "run `make bundle`");
        for (path, content) in &fresh {
            assert!(committed[path] == *content, "{dir}/bundle/{} is stale: run `make bundle`", path.display());
        }
        let dockerfile = std::fs::read_to_string(out.path().join(dir).join("bundle.Dockerfile")).unwrap();
        assert!(
            dockerfile == std::fs::read_to_string(root().join(dir).join("bundle.Dockerfile")).unwrap(),
            "{dir}/bundle.Dockerfile is stale: run `make bundle`"
        );
    }
}

#[test]
fn operator_sdk_finds_no_error_and_no_warning_in_the_driver_operators_bundle() {
    let dir = root().join("driver-operator");
    let out = operator_sdk(
        &dir,
        &["bundle", "validate", "./bundle", "-b", "none", "--select-optional", "suite=operatorframework"],
    );
    let said = text(&out);
    assert!(out.status.success(), "operator-sdk bundle validate failed:\n{said}");
    assert!(!said.contains("level=warning") && !said.contains("level=error"), "{said}");
    // The dependency that has OLM install the manager with it, on this release or later.
    let dependencies = std::fs::read_to_string(dir.join("bundle/metadata/dependencies.yaml")).unwrap();
    let dependencies: serde_yaml::Value = serde_yaml::from_str(&dependencies).unwrap();
    let value = &dependencies["dependencies"][0]["value"];
    assert_eq!(dependencies["dependencies"][0]["type"], "olm.package");
    assert_eq!(value["packageName"], "csi-addons");
    assert_eq!(value["version"].as_str(), Some(concat!(">=", env!("CARGO_PKG_VERSION"))));
    // Every image the operator installs is listed for disconnected installs.
    let csv = yaml(&dir.join("bundle/manifests/reference-driver-operator.clusterserviceversion.yaml"));
    let related: Vec<&str> =
        csv["spec"]["relatedImages"].as_sequence().unwrap().iter().filter_map(|i| i["image"].as_str()).collect();
    let deployment = &csv["spec"]["install"]["spec"]["deployments"][0]["spec"]["template"]["spec"]["containers"][0];
    let mut installed: Vec<&str> = deployment["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter(|e| e["name"].as_str().is_some_and(|n| n.ends_with("_IMAGE")))
        .filter_map(|e| e["value"].as_str())
        .collect();
    installed.push(deployment["image"].as_str().unwrap());
    for image in installed {
        assert!(related.contains(&image), "{image} is not among the relatedImages {related:?}");
    }
}

#[test]
fn operator_sdk_finds_no_error_and_no_warning_in_the_bundle() {
    let out = operator_sdk(
        &root(),
        &["bundle", "validate", "./bundle", "-b", "none", "--select-optional", "suite=operatorframework"],
    );
    let said = text(&out);
    assert!(out.status.success(), "operator-sdk bundle validate failed:\n{said}");
    assert!(!said.contains("level=warning") && !said.contains("level=error"), "{said}");
    assert!(said.contains("All validation tests have completed successfully"), "{said}");
}

#[test]
fn scorecard_basic_and_olm_tests_pass_on_the_bundle() {
    // scorecard-test reads the bundle from /bundle: give it a root of its own.
    let chroot = tempfile::tempdir().unwrap();
    std::fs::copy(operator_sdk_dir().join("scorecard-test"), chroot.path().join("scorecard-test")).unwrap();
    let copied = Command::new("cp").arg("-r").arg(root().join("bundle")).arg(chroot.path()).status().unwrap();
    assert!(copied.success());
    // Exactly the tests the bundle's scorecard configuration names.
    let config: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(root().join("bundle/tests/scorecard/config.yaml")).unwrap())
            .unwrap();
    let tests: Vec<&str> = config["stages"][0]["tests"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|t| t["entrypoint"][1].as_str().unwrap())
        .collect();
    assert_eq!(tests.len(), 6, "{tests:?}");
    for test in tests {
        let out = Command::new("chroot").arg(chroot.path()).args(["/scorecard-test", test]).output().unwrap();
        let status: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("scorecard-test {test}: {e}: {}", text(&out)));
        let result = &status["results"][0];
        assert_eq!(result["state"], "pass", "scorecard {test}: {result}");
    }
}

/// What a broken PROJECT breaks: operator-sdk registers none of its own commands.
fn operator_sdk_commands_work_in(dir: &Path) -> Result<(), String> {
    let version = operator_sdk(dir, &["version"]);
    if !version.status.success() || !text(&version).contains("v1.42.2") {
        return Err(format!("operator-sdk version: {}", text(&version)));
    }
    let help = text(&operator_sdk(dir, &["--help"]));
    for command in ["bundle", "generate", "scorecard"] {
        if !help.lines().any(|l| l.trim_start().starts_with(&format!("{command} "))) {
            return Err(format!("operator-sdk --help lists no {command}:\n{help}"));
        }
    }
    let validate = operator_sdk(dir, &["bundle", "validate", "--help"]);
    if !validate.status.success() {
        return Err(format!("operator-sdk bundle validate --help: {}", text(&validate)));
    }
    Ok(())
}

#[test]
fn operator_sdk_accepts_the_project_file_and_the_check_catches_a_broken_one() {
    operator_sdk_commands_work_in(&root()).unwrap();
    // The same check on a PROJECT with a layout operator-sdk has no plugin for must fail.
    let scratch = tempfile::tempdir().unwrap();
    let project = std::fs::read_to_string(root().join("PROJECT")).unwrap();
    std::fs::write(scratch.path().join("PROJECT"), format!("layout:\n- rust.example.io/v1\n{project}")).unwrap();
    let broken = operator_sdk_commands_work_in(scratch.path());
    assert!(broken.is_err(), "a PROJECT with an unknown layout went unnoticed");
}

fn yaml(path: &Path) -> serde_yaml::Value {
    serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn keys(schema: &serde_yaml::Value, section: &str) -> Vec<String> {
    schema["properties"][section]["properties"]
        .as_mapping()
        .map(|m| m.keys().filter_map(|k| k.as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

fn paths(owned: &serde_yaml::Value, descriptors: &str) -> Vec<String> {
    owned[descriptors]
        .as_sequence()
        .map(|s| s.iter().filter_map(|d| d["path"].as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

#[test]
fn the_csv_owns_exactly_the_bundled_crds_and_describes_every_field() {
    let manifests = root().join("bundle/manifests");
    let csv = yaml(&manifests.join("csi-addons.clusterserviceversion.yaml"));
    let owned = csv["spec"]["customresourcedefinitions"]["owned"].as_sequence().unwrap();
    let examples: Vec<serde_json::Value> =
        serde_json::from_str(csv["metadata"]["annotations"]["alm-examples"].as_str().unwrap()).unwrap();

    let mut crds = BTreeMap::new();
    for entry in std::fs::read_dir(&manifests).unwrap() {
        let path = entry.unwrap().path();
        let crd = yaml(&path);
        if crd["kind"] != "CustomResourceDefinition" {
            continue;
        }
        let name = crd["metadata"]["name"].as_str().unwrap().to_owned();
        // The file is named after the CRD: <group>_<plural>.yaml.
        let (plural, group) = name.split_once('.').unwrap();
        assert_eq!(path.file_name().unwrap().to_string_lossy(), format!("{group}_{plural}.yaml"));
        crds.insert(name, crd);
    }
    assert_eq!(crds.len(), 12);
    let owned_names: Vec<&str> = owned.iter().map(|o| o["name"].as_str().unwrap()).collect();
    assert_eq!(owned_names, crds.keys().map(String::as_str).collect::<Vec<_>>(), "owned CRDs = bundled CRDs");

    for o in owned {
        let crd = &crds[o["name"].as_str().unwrap()];
        let kind = o["kind"].as_str().unwrap();
        assert_eq!(o["kind"], crd["spec"]["names"]["kind"]);
        let version = &crd["spec"]["versions"][0];
        assert_eq!(o["version"], version["name"], "{kind}");
        assert!(o["description"].as_str().is_some_and(|d| !d.is_empty()), "{kind} has no description");
        assert!(o["resources"].as_sequence().is_some_and(|r| !r.is_empty()), "{kind} lists no resources");
        let schema = &version["schema"]["openAPIV3Schema"];
        for (section, descriptors) in [("spec", "specDescriptors"), ("status", "statusDescriptors")] {
            let described = paths(o, descriptors);
            for field in keys(schema, section) {
                assert!(described.contains(&field), "{kind}: {section}.{field} has no descriptor");
            }
        }
        assert!(examples.iter().any(|e| e["kind"] == kind), "no alm-example for {kind}");
    }
}

#[test]
fn the_csv_carries_every_operatorhub_field_pinned_to_the_release() {
    let csv = yaml(&root().join("bundle/manifests/csi-addons.clusterserviceversion.yaml"));
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(csv["metadata"]["name"].as_str(), Some(format!("csi-addons.v{version}").as_str()));
    assert_eq!(csv["spec"]["version"].as_str(), Some(version));
    let annotations = &csv["metadata"]["annotations"];
    for key in ["capabilities", "categories", "containerImage", "createdAt", "description", "repository", "support"] {
        assert!(annotations[key].as_str().is_some_and(|v| !v.is_empty()), "annotation {key} missing");
    }
    let makefile = std::fs::read_to_string(root().join("Makefile")).unwrap();
    let release_date = makefile.lines().find_map(|l| l.strip_prefix("RELEASE_DATE ?= ")).unwrap();
    assert_eq!(annotations["createdAt"].as_str(), Some(release_date));
    let spec = &csv["spec"];
    for key in ["description", "displayName", "maturity", "minKubeVersion"] {
        assert!(spec[key].as_str().is_some_and(|v| !v.is_empty()), "spec.{key} missing");
    }
    for key in ["icon", "keywords", "links", "maintainers", "installModes", "relatedImages"] {
        assert!(spec[key].as_sequence().is_some_and(|v| !v.is_empty()), "spec.{key} missing");
    }
    assert!(spec["provider"]["name"].as_str().is_some());
    let tag = format!(":v{version}");
    let images: Vec<&str> =
        spec["relatedImages"].as_sequence().unwrap().iter().filter_map(|i| i["image"].as_str()).collect();
    assert_eq!(images.len(), 2, "the manager and the sidecar");
    for image in images.iter().chain([&annotations["containerImage"].as_str().unwrap()]) {
        assert!(image.ends_with(&tag), "{image} is not pinned to {tag}");
    }
    let pod = &spec["install"]["spec"]["deployments"][0]["spec"]["template"]["spec"];
    assert!(pod["containers"][0]["image"].as_str().unwrap().ends_with(&tag));
    // As upstream's bundle: the manager keeps running on a node short of room.
    assert_eq!(pod["priorityClassName"].as_str(), Some("system-cluster-critical"));
}

/// `make operatorhub`: the community-operators layout, which the operatorframework and community
/// validators accept (the script fails on any error or warning of theirs).
#[test]
fn the_operatorhub_layout_holds_the_bundle_and_passes_the_community_validators() {
    let out = tempfile::tempdir().unwrap();
    let script = root().join("hack/operatorhub.sh");
    let ran = Command::new("bash").arg(&script).arg(out.path()).output().unwrap();
    assert!(ran.status.success(), "{}", text(&ran));
    let version = env!("CARGO_PKG_VERSION");
    let package = out.path().join("operators/csi-addons");
    assert_eq!(std::fs::read_to_string(package.join("ci.yaml")).unwrap(), "updateGraphMode: replaces-mode\n");
    assert_eq!(
        files(&package.join(version)),
        files(&root().join("bundle"))
            .into_iter()
            .filter(|(p, _)| !p.starts_with("tests") && p != Path::new("README.md"))
            .collect()
    );
}
