//! Least privilege, checked against what the product did. The cluster's API server audits every
//! request of the product's service accounts (hack/cluster.sh); run last in `make test-cluster`,
//! after the story, the suites and the driver operator's, this compares each program's requests
//! with the RBAC it ships: nothing it asked was refused, and every rule it is given was used or is
//! named below with the reason it stays.
//!
//! Programs are told apart by service account and User-Agent: the CSI-Addons sidecar shares its
//! service accounts with the CSI sidecars (external-provisioner and the others), whose rules are
//! theirs and not checked here.
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Deserialize;

/// One program: whose requests, and which of its shipped roles they are checked against.
struct Program {
    name: &'static str,
    /// Its service accounts, as `namespace/name`.
    accounts: &'static [&'static str],
    /// The start of its User-Agent (`cluster_client::user_agent`).
    agent: &'static str,
    /// The release YAMLs its roles and bindings are read from.
    files: &'static [&'static str],
    /// The roles bound to its accounts that are its own; `None`: all of them.
    roles: Option<&'static [&'static str]>,
}

const PROGRAMS: &[Program] = &[
    Program {
        name: "manager",
        accounts: &["csi-addons-system/csi-addons-controller-manager"],
        agent: "csi-addons-manager/",
        files: &["deploy/controller/rbac.yaml"],
        roles: None,
    },
    Program {
        name: "sidecar",
        accounts: &["csi-addons-reference/reference-driver-controller", "csi-addons-reference/reference-driver-node"],
        agent: "csi-addons-sidecar/",
        files: &["deploy/reference-driver/rbac.yaml", "deploy/controller/rbac.yaml"],
        roles: Some(&[
            "reference-driver-csi-addons-sidecar",
            "csi-addons-csiaddons-events-editor-role",
            "csi-addons-csiaddons-pvc-editor-role",
        ]),
    },
    Program {
        name: "certificates Job",
        accounts: &["csi-addons-reference/reference-driver-certificates"],
        agent: "reference-driver-operator/",
        files: &["deploy/reference-driver/certificates.yaml"],
        roles: None,
    },
    Program {
        name: "driver operator",
        accounts: &["reference-driver-operator/reference-driver-operator"],
        agent: "reference-driver-operator/",
        files: &["deploy/driver-operator/driver-operator.yaml"],
        roles: None,
    },
];

/// Rules no request used in the cluster suite, and why each stays: (role, group/resources,
/// verbs, why). A rule that is neither used nor named here fails the test; one named here but
/// used is reported, as its reason may be stale.
const KEPT: &[(&str, &[&str], &[&str], &str)] = &[
    (
        "csi-addons-manager-role",
        &[
            "/persistentvolumeclaims/finalizers",
            "csiaddons.openshift.io/reclaimspacecronjobs/finalizers",
            "csiaddons.openshift.io/encryptionkeyrotationcronjobs/finalizers",
        ],
        &["update"],
        "checked, never requested: the API server's OwnerReferencesPermissionEnforcement (on in OpenShift) \
         asks for it when the manager sets blockOwnerDeletion on a cron job's runs and a PVC's managed cron jobs",
    ),
    (
        "csi-addons-manager-role",
        &["csiaddons.openshift.io/csiaddonsnodes"],
        &["delete"],
        "a CSIAddonsNode whose sidecar fails to connect four times in a row is deleted; every sidecar here connects",
    ),
    (
        "csi-addons-manager-role",
        &["csiaddons.openshift.io/encryptionkeyrotationcronjobs"],
        &["create", "patch", "delete"],
        "the cron jobs of key-rotation schedule annotations, made when one is added, changed and removed \
         with it; the suite adds none",
    ),
    (
        "csi-addons-manager-role",
        &["csiaddons.openshift.io/reclaimspacecronjobs"],
        &["patch", "delete"],
        "the cron jobs of schedule annotations, made when one is added, changed and removed with it; the \
         suite adds a reclaim-space schedule and leaves it",
    ),
    (
        "csi-addons-manager-role",
        &["csiaddons.openshift.io/reclaimspacejobs", "csiaddons.openshift.io/encryptionkeyrotationjobs"],
        &["create", "delete"],
        "a cron job's runs, made and pruned beyond its history limits: no schedule comes round during the \
         suite (tests/integration covers them)",
    ),
    (
        "csi-addons-manager-role",
        &[
            "csiaddons.openshift.io/reclaimspacecronjobs/status",
            "csiaddons.openshift.io/encryptionkeyrotationcronjobs/status",
        ],
        &["patch"],
        "a cron job's status records its runs: no schedule comes round during the suite",
    ),
    (
        "csi-addons-manager-role",
        &["replication.storage.openshift.io/volumereplications"],
        &["delete"],
        "a group's VolumeReplication, deleted when its group goes; when the group's namespace goes, the \
         namespace controller often deletes it first",
    ),
    (
        "csi-addons-manager-role",
        &[
            "csiaddons.openshift.io/reclaimspacejobs",
            "csiaddons.openshift.io/encryptionkeyrotationjobs",
            "csiaddons.openshift.io/reclaimspacecronjobs",
            "csiaddons.openshift.io/encryptionkeyrotationcronjobs",
            "csiaddons.openshift.io/networkfences",
            "csiaddons.openshift.io/networkfenceclasses",
            "replication.storage.openshift.io/volumereplications",
            "replication.storage.openshift.io/volumegroupreplications",
            "replication.storage.openshift.io/volumegroupreplicationcontents",
            "/namespaces",
            "storage.k8s.io/storageclasses",
            "storage.k8s.io/volumeattachments",
        ],
        &["list"],
        "a watch's first list where the API server does not stream it in the watch (the WatchList feature \
         off, as by default before Kubernetes 1.32); this one streams it, and the audit log records a watch",
    ),
    (
        "csi-addons-csiaddons-events-editor-role",
        &["/events"],
        &["get", "list", "watch", "patch", "update", "delete"],
        "upstream's role for drivers' sidecars, shipped as upstream ships it: upstream's sidecar patches \
         repeated Events; ours only creates them",
    ),
    (
        "csi-addons-csiaddons-events-editor-role",
        &["/persistentvolumeclaims"],
        &["get"],
        "upstream's role for drivers' sidecars, shipped as upstream ships it: upstream's sidecar reads the PVC \
         an Event is about; ours has its name from the PV",
    ),
    (
        "csi-addons-csiaddons-pvc-editor-role",
        &["/persistentvolumeclaims"],
        &["get"],
        "upstream's role for drivers' sidecars, shipped as upstream ships it; ours only patches the PVC",
    ),
    (
        "reference-driver-csi-addons-sidecar",
        &["csiaddons.openshift.io/csiaddonsnodes", "coordination.k8s.io/leases"],
        &["update"],
        "upstream's sidecar, a drop-in for ours, updates its CSIAddonsNode and renews its Lease by update",
    ),
    (
        "reference-driver-csi-addons-sidecar",
        &["/persistentvolumes"],
        &["list"],
        "a volume condition for a volume the kubelet has not published under its PV's name (block or \
         staged only); this node's volumes are all published",
    ),
    (
        "reference-driver-csi-addons-sidecar",
        &["/secrets"],
        &["get"],
        "the Secret a class, fence or PV names for the driver; the suite's classes name none",
    ),
    (
        "reference-driver-csi-addons-sidecar",
        &["apps/replicasets"],
        &["get"],
        "a sidecar in a Deployment's Pod names the Deployment, found through its ReplicaSet, as its owner; \
         the reference driver runs a StatefulSet and a DaemonSet",
    ),
    (
        "reference-driver-operator",
        &[
            "/namespaces",
            "/secrets",
            "/serviceaccounts",
            "apps/daemonsets",
            "apps/statefulsets",
            "storage.k8s.io/csidrivers",
            "storage.k8s.io/storageclasses",
            "rbac.authorization.k8s.io/clusterroles",
            "rbac.authorization.k8s.io/clusterrolebindings",
            "csiaddons.openshift.io/networkfenceclasses",
            "replication.storage.openshift.io/volumereplicationclasses",
            "replication.storage.openshift.io/volumegroupreplicationclasses",
        ],
        &["create"],
        "checked, never requested: server-side apply needs it to make an object, and the audit log records \
         the request as a patch",
    ),
    (
        "reference-driver-operator",
        &["rbac.authorization.k8s.io/clusterroles"],
        &["escalate", "bind"],
        "checked, never requested: the driver's roles and bindings grant what the operator does not hold",
    ),
    (
        "reference-driver-operator",
        &["events.k8s.io/events"],
        &["create", "patch"],
        "Events when a rollout fails or recovers, credentials cannot be copied or a class is kept; none \
         happened in this suite",
    ),
    (
        "reference-driver-operator-credentials",
        &["/secrets"],
        &["get"],
        "the credentials Secret spec.credentialsSecret names; the cluster suite names none \
         (tests/integration/driver/operator_credentials.rs does)",
    ),
    (
        "reference-driver-certificates",
        &["/secrets"],
        &["create"],
        "checked, never requested: server-side apply needs it to make the Secrets, recorded as patches",
    ),
];

/// The reason `KEPT` gives for `atom`, if any.
fn kept(atom: &Atom) -> Option<&'static str> {
    KEPT.iter()
        .find(|(role, resources, verbs, _)| {
            *role == atom.role && resources.contains(&atom.resource.as_str()) && verbs.contains(&atom.verb.as_str())
        })
        .map(|(_, _, _, why)| *why)
}

#[derive(Deserialize)]
struct Rule {
    #[serde(default, rename = "apiGroups")]
    groups: Vec<String>,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    verbs: Vec<String>,
    #[serde(default, rename = "resourceNames")]
    names: Vec<String>,
}

/// A role's rules, and the namespace they hold in (`None`: a ClusterRole bound cluster-wide).
struct Grant {
    role: String,
    namespace: Option<String>,
    rules: Vec<Rule>,
}

/// One permission a grant gives: a verb on a resource, perhaps limited to names or a namespace.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Atom {
    role: String,
    resource: String,
    verb: String,
    names: Vec<String>,
    namespace: Option<String>,
}

/// One audited request: who, with what agent, asked what, and the answer's code.
struct Request {
    account: String,
    agent: String,
    verb: String,
    /// `group/resource[/subresource]` (`/pods` for the core group).
    resource: String,
    namespace: Option<String>,
    name: Option<String>,
    code: u16,
    /// Whether the authorizer refused it (a 403 can also come from admission, for example a new
    /// object in a namespace being deleted).
    refused: bool,
}

fn repository(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// The grants bound to `account` (`namespace/name`) in `files`.
fn grants(files: &[&str], account: &str) -> Vec<Grant> {
    let (account_namespace, account_name) = account.split_once('/').expect("accounts are namespace/name");
    // By kind, name and namespace: a Role and a ClusterRole may share a name.
    let mut roles: BTreeMap<(String, String, Option<String>), Vec<serde_json::Value>> = BTreeMap::new();
    let mut bindings = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(repository(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        for document in serde_yaml::Deserializer::from_str(&text) {
            let object = serde_json::Value::deserialize(document).unwrap_or_else(|e| panic!("{file}: {e}"));
            let kind = object["kind"].as_str().unwrap_or_default().to_owned();
            let name = object["metadata"]["name"].as_str().unwrap_or_default().to_owned();
            let namespace = object["metadata"]["namespace"].as_str().map(str::to_owned);
            match kind.as_str() {
                "Role" | "ClusterRole" => {
                    let namespace = namespace.filter(|_| kind == "Role");
                    roles.insert((kind, name, namespace), object["rules"].as_array().cloned().unwrap_or_default());
                }
                "RoleBinding" | "ClusterRoleBinding" => bindings.push((namespace, object)),
                _ => {}
            }
        }
    }
    let mut found = Vec::new();
    for (namespace, binding) in bindings {
        let names_account =
            binding["subjects"].as_array().into_iter().flatten().any(|s| {
                s["kind"] == "ServiceAccount" && s["name"] == account_name && s["namespace"] == account_namespace
            });
        if !names_account {
            continue;
        }
        let role = binding["roleRef"]["name"].as_str().unwrap_or_default().to_owned();
        let role_kind = binding["roleRef"]["kind"].as_str().unwrap_or_default().to_owned();
        let role_namespace = namespace.clone().filter(|_| role_kind == "Role");
        let rules = roles
            .get(&(role_kind, role.clone(), role_namespace))
            .unwrap_or_else(|| panic!("the role {role} bound to {account} is in {files:?}"));
        let rules = rules.iter().map(|r| serde_json::from_value(r.clone()).expect("a role's rule")).collect();
        found.push(Grant { role, namespace, rules });
    }
    found
}

fn atoms(grants: &[Grant]) -> BTreeSet<Atom> {
    let mut atoms = BTreeSet::new();
    for grant in grants {
        for rule in &grant.rules {
            for group in &rule.groups {
                for resource in &rule.resources {
                    for verb in &rule.verbs {
                        atoms.insert(Atom {
                            role: grant.role.clone(),
                            resource: format!("{group}/{resource}"),
                            verb: verb.clone(),
                            names: rule.names.clone(),
                            namespace: grant.namespace.clone(),
                        });
                    }
                }
            }
        }
    }
    atoms
}

impl Atom {
    fn allows(&self, request: &Request) -> bool {
        self.resource == request.resource
            && self.verb == request.verb
            && (self.names.is_empty() || request.name.as_ref().is_some_and(|n| self.names.contains(n)))
            && (self.namespace.is_none() || self.namespace == request.namespace)
    }
}

/// Every completed request of the audited accounts, from each file of the audit log.
fn requests(directory: &Path) -> Vec<Request> {
    let mut requests = Vec::new();
    let entries = std::fs::read_dir(directory).unwrap_or_else(|e| panic!("the audit log {}: {e}", directory.display()));
    for entry in entries {
        let path = entry.expect("an audit log file").path();
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for line in text.lines().filter(|l| !l.is_empty()) {
            let event: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            if event["stage"] != "ResponseComplete" {
                continue;
            }
            let Some(account) =
                event["user"]["username"].as_str().and_then(|u| u.strip_prefix("system:serviceaccount:"))
            else {
                continue;
            };
            let object = &event["objectRef"];
            let Some(resource) = object["resource"].as_str() else { continue };
            let resource = match object["subresource"].as_str() {
                Some(sub) => format!("{}/{resource}/{sub}", object["apiGroup"].as_str().unwrap_or_default()),
                None => format!("{}/{resource}", object["apiGroup"].as_str().unwrap_or_default()),
            };
            requests.push(Request {
                account: account.replacen(':', "/", 1),
                agent: event["userAgent"].as_str().unwrap_or_default().to_owned(),
                verb: event["verb"].as_str().unwrap_or_default().to_owned(),
                resource,
                namespace: object["namespace"].as_str().map(str::to_owned),
                name: object["name"].as_str().map(str::to_owned),
                code: event["responseStatus"]["code"].as_u64().and_then(|c| u16::try_from(c).ok()).unwrap_or_default(),
                refused: event["annotations"]["authorization.k8s.io/decision"] == "forbid",
            });
        }
    }
    requests
}

/// `verb group/resource` of a request, for the report.
fn describe(request: &Request) -> String {
    let place = match (&request.namespace, &request.name) {
        (Some(namespace), Some(name)) => format!(" {namespace}/{name}"),
        (None, Some(name)) => format!(" {name}"),
        (Some(namespace), None) => format!(" in {namespace}"),
        (None, None) => String::new(),
    };
    format!("{} {}{place} ({})", request.verb, request.resource, request.code)
}

#[tokio::test]
#[ignore = "needs the one-node cluster after the other cluster tests: make test-cluster"]
async fn every_rule_the_product_ships_was_used_or_is_named_and_nothing_it_asked_was_refused() {
    let directory = std::env::var("CLUSTER_AUDIT_DIR").expect("CLUSTER_AUDIT_DIR (set by hack/cluster.sh exec)");
    let all = requests(Path::new(&directory));
    let mut failures = Vec::new();
    let mut kept_used = Vec::new();
    let mut all_granted = BTreeSet::new();
    for program in PROGRAMS {
        let mine: Vec<&Request> = all
            .iter()
            .filter(|r| program.accounts.contains(&r.account.as_str()) && r.agent.starts_with(program.agent))
            .collect();
        assert!(!mine.is_empty(), "the audit log holds requests of the {} ({:?})", program.name, program.accounts);
        let refused: BTreeSet<String> = mine.iter().filter(|r| r.refused).map(|r| describe(r)).collect();
        let mut granted = BTreeSet::new();
        for account in program.accounts {
            let account_grants: Vec<Grant> = grants(program.files, account)
                .into_iter()
                .filter(|g| program.roles.is_none_or(|own| own.contains(&g.role.as_str())))
                .collect();
            granted.extend(atoms(&account_grants));
        }
        let (used, unused): (Vec<&Atom>, Vec<&Atom>) =
            granted.iter().partition(|atom| mine.iter().any(|r| !r.refused && atom.allows(r)));
        println!(
            "{}: {} requests by {}, {} refused; {} of {} granted (role, verb, resource) used",
            program.name,
            mine.len(),
            program.accounts.join(" and "),
            refused.len(),
            used.len(),
            granted.len()
        );
        let mut by_rule: BTreeMap<(&str, &str), Vec<&str>> = BTreeMap::new();
        for atom in &used {
            by_rule.entry((&atom.role, &atom.resource)).or_default().push(&atom.verb);
        }
        for ((role, resource), verbs) in by_rule {
            println!("  used    {role:<45} {resource:<50} {}", verbs.join(","));
        }
        for atom in unused {
            match kept(atom) {
                Some(why) => {
                    println!("  kept    {:<45} {:<50} {}: {why}", atom.role, atom.resource, atom.verb)
                }
                None => {
                    println!("  UNUSED  {:<45} {:<50} {}", atom.role, atom.resource, atom.verb);
                    failures.push(format!(
                        "{}: {} {} of {} was never used",
                        program.name, atom.verb, atom.resource, atom.role
                    ));
                }
            }
        }
        for request in &refused {
            println!("  REFUSED {request}");
            failures.push(format!("{}: {request} was refused", program.name));
        }
        kept_used.extend(
            used.iter().filter(|a| kept(a).is_some()).map(|a| format!("{} {} of {}", a.verb, a.resource, a.role)),
        );
        all_granted.extend(granted);
    }
    // Every reason names a rule some role grants: a misspelt one would excuse nothing.
    for (role, resources, verbs, _) in KEPT {
        for resource in *resources {
            for verb in *verbs {
                let granted = all_granted.iter().any(|a| a.role == *role && a.resource == *resource && a.verb == *verb);
                if !granted {
                    failures.push(format!("KEPT names {verb} {resource} of {role}, which no shipped role grants"));
                }
            }
        }
    }
    if !kept_used.is_empty() {
        println!("named as unused but used in this run (the reason may be stale): {}", kept_used.join("; "));
    }
    assert!(failures.is_empty(), "RBAC against the audit log:\n  {}", failures.join("\n  "));
}
