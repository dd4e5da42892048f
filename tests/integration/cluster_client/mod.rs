pub mod election;
pub mod kubeconfig_loaders;
pub mod routes;
