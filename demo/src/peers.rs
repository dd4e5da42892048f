//! Which build runs each half of CSI-Addons: ours, or upstream's v0.14.0 binary (the interop suite,
//! `make test-interop`). Both take the same flags, which is what makes either half a drop-in
//! replacement; only how a process finds its credentials differs.
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Error, Result};

/// The build of one half.
#[derive(Clone, Debug, Default)]
pub enum Build {
    #[default]
    Ours,
    /// Upstream's binary at this path (hack/upstream-binaries.sh builds it).
    Upstream(PathBuf),
}

impl Build {
    pub fn is_upstream(&self) -> bool {
        matches!(self, Build::Upstream(_))
    }

    pub fn label(&self) -> &'static str {
        match self {
            Build::Ours => "ours",
            Build::Upstream(_) => "upstream v0.14.0",
        }
    }
}

/// The files a Pod finds under /var/run/secrets/kubernetes.io/serviceaccount.
pub struct ServiceAccountFiles {
    pub dir: PathBuf,
}

impl ServiceAccountFiles {
    /// Writes `token` (owner-only), the API server's CA and the namespace into `dir`.
    pub fn write(dir: PathBuf, token: &str, ca_cert: &Path, namespace: &str) -> Result<Self> {
        std::fs::create_dir_all(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        let token_path = dir.join("token");
        std::fs::write(&token_path, token).map_err(Error::io("writing a ServiceAccount token"))?;
        std::fs::set_permissions(&token_path, std::fs::Permissions::from_mode(0o600))
            .map_err(Error::io("restricting a ServiceAccount token"))?;
        std::fs::copy(ca_cert, dir.join("ca.crt")).map_err(Error::io("copying the API server's CA"))?;
        std::fs::write(dir.join("namespace"), namespace).map_err(Error::io("writing a ServiceAccount namespace"))?;
        Ok(ServiceAccountFiles { dir })
    }

    pub fn token(&self) -> PathBuf {
        self.dir.join("token")
    }

    /// A command that runs `binary` as if in a Pod with these files mounted. Upstream's binaries
    /// read their ServiceAccount only from the fixed in-cluster path: the command gives the process
    /// a mount namespace of its own with a tmpfs over /run (/var/run links to it) holding the files,
    /// so nothing on the machine changes (build-facts.md). `api_port` is the API server's port on
    /// 127.0.0.1, as the in-cluster environment variables give it.
    pub fn in_cluster_command(&self, binary: &Path, api_port: &str) -> Command {
        const MOUNTED: &str = "/run/secrets/kubernetes.io/serviceaccount";
        // `exec "$0" "$@"` keeps one process: stopping the command's PID stops the binary.
        let script = format!(
            "mount -t tmpfs none /run && mkdir -p {MOUNTED} && cp '{d}/token' '{d}/ca.crt' '{d}/namespace' {MOUNTED}/ \
             && exec \"$0\" \"$@\"",
            d = self.dir.display()
        );
        let mut command = Command::new("unshare");
        command
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .arg(binary)
            .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
            .env("KUBERNETES_SERVICE_PORT", api_port);
        command
    }
}
