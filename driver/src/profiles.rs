//! Storage profiles: what kinds of volume this driver can serve on this machine. GetPluginInfo
//! reports them in its manifest (key `profiles`), so the driver operator can keep one
//! StorageClass per profile, and a StorageClass's `profile` parameter asks for one.
use std::path::Path;

use tonic::Status;

use crate::state::AccessType;

/// GetPluginInfo's manifest key, and the StorageClass parameter.
pub const KEY: &str = "profiles";
pub const PARAMETER: &str = "profile";

/// A kind of volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// ext4 on a loop-attached sparse file.
    Filesystem,
    /// A raw loop device.
    Block,
    /// A plain directory, bind-mounted (machines without loop devices).
    Directory,
}

impl Profile {
    pub fn name(self) -> &'static str {
        match self {
            Profile::Filesystem => "filesystem",
            Profile::Block => "block",
            Profile::Directory => "directory",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        [Profile::Filesystem, Profile::Block, Profile::Directory].into_iter().find(|p| p.name() == text)
    }
}

/// The profiles served here: none while the state directory cannot be written (the storage
/// behind it is gone, full of inodes or read-only), else the directory profile where filesystem
/// volumes are directories, and filesystem and block volumes where they are loop devices.
pub fn served(state_dir: &Path, directories: bool) -> Vec<Profile> {
    let probe = state_dir.join(".profiles-probe");
    if let Err(e) = std::fs::write(&probe, b"").and_then(|()| std::fs::remove_file(&probe)) {
        tracing::warn!(error = %e, dir = %state_dir.display(), "the state directory cannot be written: no profile served");
        return Vec::new();
    }
    if directories { vec![Profile::Directory] } else { vec![Profile::Filesystem, Profile::Block] }
}

/// The manifest value: the served profiles' names, comma-separated.
pub fn manifest_value(profiles: &[Profile]) -> String {
    profiles.iter().map(|p| p.name()).collect::<Vec<_>>().join(",")
}

/// Whether a volume of `access` fits the StorageClass's `profile` parameter (when it has one) on
/// a machine whose filesystem volumes are `directories`.
pub fn check(parameter: Option<&str>, access: AccessType, directories: bool) -> Result<(), Status> {
    let Some(text) = parameter else { return Ok(()) };
    let profile = Profile::parse(text).ok_or_else(|| {
        Status::invalid_argument(format!(
            "StorageClass parameter profile={text:?}: not one of filesystem, block, directory"
        ))
    })?;
    let served_here = match profile {
        Profile::Directory => directories,
        Profile::Filesystem | Profile::Block => !directories,
    };
    if !served_here {
        return Err(Status::invalid_argument(format!(
            "StorageClass parameter profile={text}: this driver keeps filesystem volumes as {}, so it does not serve it",
            if directories { "directories" } else { "loop devices" }
        )));
    }
    let fits = matches!(
        (profile, access),
        (Profile::Block, AccessType::Block) | (Profile::Filesystem | Profile::Directory, AccessType::Mount)
    );
    if !fits {
        return Err(Status::invalid_argument(format!(
            "StorageClass parameter profile={text} does not serve {access:?} volumes: use the class of the {} profile",
            if access == AccessType::Block { "block" } else { "filesystem" }
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_follow_the_machine_and_a_read_only_directory_serves_none() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(served(dir.path(), false), [Profile::Filesystem, Profile::Block]);
        assert_eq!(manifest_value(&served(dir.path(), true)), "directory");
        assert!(served(&dir.path().join("missing"), false).is_empty());
    }

    #[test]
    fn a_class_profile_must_be_served_here_and_fit_the_volume_mode() {
        check(None, AccessType::Block, true).unwrap();
        check(Some("block"), AccessType::Block, false).unwrap();
        check(Some("filesystem"), AccessType::Mount, false).unwrap();
        let wrong_mode = check(Some("block"), AccessType::Mount, false).unwrap_err();
        assert!(wrong_mode.message().contains("filesystem profile"), "{}", wrong_mode.message());
        let not_here = check(Some("directory"), AccessType::Mount, false).unwrap_err();
        assert!(not_here.message().contains("loop devices"), "{}", not_here.message());
        assert!(check(Some("ssd"), AccessType::Mount, false).unwrap_err().message().contains("not one of"));
    }
}
