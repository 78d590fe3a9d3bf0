//! Requests through a gateway by the endpoint it named as serving them:
//! one series per endpoint and outcome seen (at most 64 endpoints per
//! target, the rest as `other`), so a target probed only through its
//! gateway still shows which replica answered, failed or was shed.

use super::MetricsError;
use super::page::{Counters, Page};
use crate::vocabulary::Outcome;

pub struct GatewayMetrics {
    requests: Counters,
}

impl GatewayMetrics {
    pub fn new(page: &Page) -> Result<Self, MetricsError> {
        Ok(GatewayMetrics {
            requests: page.counters(
                "sentinel_gateway_requests_total",
                "Probe requests through the target's gateway by the endpoint its response header named as serving them, and how they ended.",
                &["target", "endpoint", "outcome"],
            )?,
        })
    }

    /// Counts requests attributed to endpoints (labels as the board keeps
    /// them).
    pub fn count(&self, target: &str, served: &[(String, Outcome)]) {
        for (endpoint, outcome) in served {
            self.requests.inc(&[target, endpoint, outcome.as_str()]);
        }
    }
}
