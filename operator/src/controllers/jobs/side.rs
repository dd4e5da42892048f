//! Which side reclaims a volume's space, when a user chooses: the annotation
//! `csi-addons-rs.io/reclaim-side` (`node`, `controller` or `both`) on the ReclaimSpaceJob, its PVC
//! or the PVC's StorageClass, the first of these that has it deciding. Without it both sides
//! reclaim, as upstream routes them. Upstream's CRDs know nothing of it: it is an annotation so
//! that objects written for upstream stay valid, and upstream's manager ignores it. Pure. [differs: reclaim-side]
use std::fmt;

pub const RECLAIM_SIDE_ANNOTATION: &str = "csi-addons-rs.io/reclaim-side";

/// The calls a reclaim makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReclaimSide {
    /// NodeReclaimSpace only, through the sidecar of the node where the volume is attached.
    Node,
    /// ControllerReclaimSpace only, through the driver's leader sidecar.
    Controller,
    /// Each side the driver offers, node side first (upstream's routing).
    #[default]
    Both,
}

impl fmt::Display for ReclaimSide {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReclaimSide::Node => "node",
            ReclaimSide::Controller => "controller",
            ReclaimSide::Both => "both",
        })
    }
}

/// Where the side came from, for the messages that name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SideSource {
    Job,
    Pvc,
    StorageClass,
    /// No annotation anywhere.
    Default,
}

impl fmt::Display for SideSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let on = match self {
            SideSource::Job => "ReclaimSpaceJob",
            SideSource::Pvc => "PVC",
            SideSource::StorageClass => "StorageClass",
            SideSource::Default => return f.write_str("the default"),
        };
        write!(f, "the {on}'s annotation {RECLAIM_SIDE_ANNOTATION}")
    }
}

/// The side a job reclaims on, and what chose it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChosenSide {
    pub side: ReclaimSide,
    pub from: SideSource,
}

impl ChosenSide {
    /// Whether a user asked for one side: then a side the driver does not serve fails the job,
    /// where upstream's routing quietly reclaims on the other side.
    pub fn is_explicit(&self) -> bool {
        self.side != ReclaimSide::Both
    }
}

/// A value the annotation does not take. It fails the job at once: falling back to another side
/// or object would reclaim where the user did not ask.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{from} is {value:?}: it takes node, controller or both")]
pub struct BadSide {
    pub from: SideSource,
    /// At most 63 characters of it: the message goes into the job's status.
    pub value: String,
}

/// The annotation's values on the job, the PVC and the StorageClass; the first present decides,
/// and an empty or unknown value there is an error rather than a reason to look further.
pub fn chosen_side(job: Option<&str>, pvc: Option<&str>, class: Option<&str>) -> Result<ChosenSide, BadSide> {
    let found = [(SideSource::Job, job), (SideSource::Pvc, pvc), (SideSource::StorageClass, class)]
        .into_iter()
        .find_map(|(from, value)| Some((from, value?)));
    let Some((from, value)) = found else {
        return Ok(ChosenSide { side: ReclaimSide::Both, from: SideSource::Default });
    };
    let side = match value {
        "node" => ReclaimSide::Node,
        "controller" => ReclaimSide::Controller,
        "both" => ReclaimSide::Both,
        other => return Err(BadSide { from, value: other.chars().take(63).collect() }),
    };
    Ok(ChosenSide { side, from })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_then_the_pvc_then_the_storage_class_decides() {
        let side = |job, pvc, class| chosen_side(job, pvc, class).map(|c| (c.side, c.from));
        assert_eq!(side(None, None, None), Ok((ReclaimSide::Both, SideSource::Default)));
        assert_eq!(side(None, None, Some("node")), Ok((ReclaimSide::Node, SideSource::StorageClass)));
        assert_eq!(side(None, Some("controller"), Some("node")), Ok((ReclaimSide::Controller, SideSource::Pvc)));
        assert_eq!(side(Some("both"), Some("controller"), Some("node")), Ok((ReclaimSide::Both, SideSource::Job)));
        assert_eq!(side(Some("node"), None, Some("controller")), Ok((ReclaimSide::Node, SideSource::Job)));
    }

    #[test]
    fn a_value_it_does_not_take_is_an_error_naming_where_it_is() {
        let bad = chosen_side(None, Some("Node"), Some("node")).unwrap_err();
        assert_eq!(bad, BadSide { from: SideSource::Pvc, value: "Node".into() });
        assert_eq!(
            bad.to_string(),
            "the PVC's annotation csi-addons-rs.io/reclaim-side is \"Node\": it takes node, controller or both"
        );
        assert_eq!(chosen_side(Some(""), None, None).unwrap_err().from, SideSource::Job);
        let long = "x".repeat(10_000);
        assert_eq!(chosen_side(None, None, Some(&long)).unwrap_err().value.len(), 63);
    }

    #[test]
    fn only_a_single_side_is_explicit() {
        let explicit = |side| ChosenSide { side, from: SideSource::Job }.is_explicit();
        assert!(explicit(ReclaimSide::Node) && explicit(ReclaimSide::Controller) && !explicit(ReclaimSide::Both));
        assert_eq!(SideSource::Default.to_string(), "the default");
    }
}
