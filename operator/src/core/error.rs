//! How a failed reconcile pass is told apart, for every controller: worth a retry soon, not worth
//! one until the object changes, or a problem of the manager's own setup. A controller's error
//! type (its own thiserror enum, or `kube::Error` for the passes whose only failures are API
//! calls) says each error's category; the category decides the retry
//! (`core::run::error_policy`), the `csi_addons_reconcile_errors_total` label and the reason of
//! the Warning event on the object. Upstream retries every failure with controller-runtime's
//! backoff and says nothing on the object. [differs: error-categories]
use std::time::Duration;

/// What kind of failure an error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    /// Likely to pass by itself (the API server or a sidecar away, a conflict): retried soon, and
    /// only counted and logged (an event each time would be noise).
    Transient,
    /// Fails the same way until the object (or what it names) changes: no hot retry, a slow one
    /// in case what it names changes unseen; told on the object.
    Permanent,
    /// The manager's own setup (its RBAC, a CRD not installed): retried slowly, and told on the
    /// object.
    Configuration,
}

impl Category {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Category::Transient => "transient",
            Category::Permanent => "permanent",
            Category::Configuration => "configuration",
        }
    }

    /// The reason of the Warning event on the object, for the categories that get one.
    pub fn reason(self) -> Option<&'static str> {
        match self {
            Category::Transient => None,
            Category::Permanent => Some("ReconcileFailed"),
            Category::Configuration => Some("ManagerMisconfigured"),
        }
    }

    /// When the object is looked at again (sooner if it changes).
    pub fn retry(self) -> Duration {
        match self {
            Category::Transient => Duration::from_secs(5),
            Category::Configuration => Duration::from_secs(60),
            Category::Permanent => Duration::from_secs(300),
        }
    }
}

/// An error a reconcile pass ends with.
pub trait Categorized: std::error::Error + Send + Sync + 'static {
    fn category(&self) -> Category;

    /// Whether the controller has already told the user with an event of its own (then the
    /// category's event would say it twice).
    fn announced(&self) -> bool {
        false
    }
}

/// The category of a Kubernetes API error: refused by RBAC or not served is the manager's setup;
/// invalid is the object's own; anything else (a conflict, a timeout, the server away) passes.
pub fn kube_category(error: &kube::Error) -> Category {
    match error {
        kube::Error::Api(status) if status.code == 403 || status.code == 405 => Category::Configuration,
        kube::Error::Api(status)
            if status.code == 404
                && status.reason == "NotFound"
                && status.message.contains("the server could not find the requested resource") =>
        {
            Category::Configuration
        }
        kube::Error::Api(status) if status.code == 400 || status.code == 422 => Category::Permanent,
        _ => Category::Transient,
    }
}

/// Kubernetes API errors alone (the passes whose only failures are API calls).
impl Categorized for kube::Error {
    fn category(&self) -> Category {
        kube_category(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            reason: reason.into(),
            message: message.into(),
            ..Default::default()
        }))
    }

    #[test]
    fn api_errors_have_their_category() {
        assert_eq!(kube_category(&api(403, "Forbidden", "forbidden")), Category::Configuration);
        assert_eq!(kube_category(&api(422, "Invalid", "spec.x: Invalid value")), Category::Permanent);
        assert_eq!(kube_category(&api(409, "Conflict", "the object has been modified")), Category::Transient);
        assert_eq!(kube_category(&api(500, "InternalError", "etcd")), Category::Transient);
        let not_served = api(404, "NotFound", "the server could not find the requested resource");
        assert_eq!(kube_category(&not_served), Category::Configuration);
        assert_eq!(Category::Transient.label(), "transient");
    }

    #[test]
    fn only_transient_errors_retry_soon_and_only_the_others_get_an_event() {
        let policy = |c: Category| (c.retry().as_secs(), c.reason());
        assert_eq!(policy(Category::Transient), (5, None));
        assert_eq!(policy(Category::Configuration), (60, Some("ManagerMisconfigured")));
        assert_eq!(policy(Category::Permanent), (300, Some("ReconcileFailed")));
    }
}
