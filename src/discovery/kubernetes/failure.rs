//! A failed list or watch, said the way an operator fixes it: a 403 names
//! the verb and the resource the role lacks, other answers their status,
//! and nothing of the credentials. A 410 is no failure: the list is
//! older than the server keeps, and the watcher lists again.

use kube::runtime::watcher;

/// What failed, ready to log and count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    text: String,
    /// What failed: `endpointslices`, `pods`, or the credentials.
    pub resource: &'static str,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl Failure {
    /// No credentials, or unusable ones (the kubeconfig named, the
    /// cluster's service account).
    pub fn credentials(why: &str) -> Failure {
        Failure {
            text: format!(
                "Kubernetes credentials: {}",
                crate::text::clean(why, crate::text::MAX_MESSAGE_LEN)
            ),
            resource: "credentials",
        }
    }

    /// A watcher's error on `resource` (`endpointslices`, `pods`) in
    /// `namespace`; `None` for a 410, which only means listing again.
    /// `listing` is the verb of the watcher's list phase.
    pub fn of_watch(
        e: &watcher::Error,
        listing: &str,
        resource: &'static str,
        namespace: &str,
    ) -> Option<Failure> {
        let (verb, status) = match e {
            watcher::Error::InitialListFailed(e) => (listing, api_status(e)),
            watcher::Error::WatchStartFailed(e) | watcher::Error::WatchFailed(e) => {
                ("watch", api_status(e))
            }
            watcher::Error::WatchError(status) => {
                ("watch", Some((status.code, status.reason.clone())))
            }
            watcher::Error::NoResourceVersion => ("list", None),
        };
        let group = if resource == "endpointslices" {
            "endpointslices.discovery.k8s.io"
        } else {
            resource
        };
        let text = match status {
            Some((410, _)) => return None,
            Some((403, _)) => format!(
                "403 Forbidden: the service account's role lacks {verb} on {group} in namespace {namespace} (grant get, list and watch on endpointslices and pods; deploy/kubernetes has the Role)"
            ),
            Some((401, _)) => format!(
                "401 Unauthorized: the API server refused the credentials to {verb} {group} in namespace {namespace}"
            ),
            Some((404, _)) => format!(
                "404 Not Found: {group} in namespace {namespace} (does the namespace exist, and does the server serve discovery.k8s.io/v1?)"
            ),
            Some((code, reason)) => format!(
                "{verb} {group} in namespace {namespace}: HTTP {code} {}",
                crate::text::clean(&reason, 64)
            ),
            None => format!(
                "{verb} {group} in namespace {namespace}: {}",
                crate::text::clean(&e.to_string(), crate::text::MAX_MESSAGE_LEN)
            ),
        };
        Some(Failure { text, resource })
    }
}

/// The API's answer, when the server gave one.
fn api_status(e: &kube::Error) -> Option<(u16, String)> {
    match e {
        kube::Error::Api(status) => Some((status.code, status.reason.clone())),
        _ => None,
    }
}
