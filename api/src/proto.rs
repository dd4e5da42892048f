//! Generated protocol code. Module nesting mirrors the proto packages (the generated code refers to
//! sibling packages through `super::`), so package and service names on the wire stay upstream's.
#![allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]

/// The Container Storage Interface, `csi.v1` (spec v1.12.0).
pub mod csi {
    pub mod v1 {
        tonic::include_proto!("csi.v1");
    }
}

/// CSI-Addons `identity.Identity`, served by drivers and forwarded by the sidecar.
pub mod identity {
    tonic::include_proto!("identity");
}

/// CSI-Addons `reclaimspace.ReclaimSpaceController` / `ReclaimSpaceNode`.
pub mod reclaimspace {
    tonic::include_proto!("reclaimspace");
}

/// CSI-Addons `fence.FenceController`.
pub mod fence {
    tonic::include_proto!("fence");
}

/// CSI-Addons `replication.Controller`.
pub mod replication {
    tonic::include_proto!("replication");
}

/// CSI-Addons `volumegroup.Controller`.
pub mod volumegroup {
    tonic::include_proto!("volumegroup");
}

/// CSI-Addons `encryptionkeyrotation.EncryptionKeyRotationController`.
pub mod encryptionkeyrotation {
    tonic::include_proto!("encryptionkeyrotation");
}

/// The controller↔sidecar protocol (proto package `proto`): requests name PVs and secret
/// references; the sidecar resolves them and calls the driver.
pub mod internal {
    tonic::include_proto!("proto");
}

/// The kubelet's plugin registration API (`pluginregistration.Registration`): a node plugin's
/// registrar serves it on a socket in the kubelet's `plugins_registry` directory.
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}

include!(concat!(env!("OUT_DIR"), "/redacted_debug.rs"));

#[cfg(test)]
mod tests;
