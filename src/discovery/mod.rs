//! A target's replicas as its `[targets.replicas]` source lists them now:
//! the ready endpoints of a Kubernetes Service (watched), a static list,
//! DNS A/AAAA records, or a Prometheus file_sd file. Each read gives the
//! whole list (at most `max_replicas`, with what was dropped and why) or
//! an error; the caller keeps the last list on an error. A watched source
//! also says when it changed and how its watches went.

mod address;
mod file_sd;
pub mod kubernetes;

use std::net::{IpAddr, SocketAddr};

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{NameServerConfig, ResolverConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;

use crate::config::{ReplicaSource, ReplicasConfig};

/// One replica: how it is reached and how its series name it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Replica {
    /// The `replica` label: the pod's name when Kubernetes lists it, else
    /// `host:port`.
    pub label: String,
    pub base_url: String,
    /// Where a pod runs and what image, when Kubernetes says.
    pub placement: Option<Placement>,
}

/// What the Kubernetes API says of a replica's pod.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize)]
pub struct Placement {
    /// `ip:port` probed.
    pub address: String,
    pub node: Option<String>,
    pub zone: Option<String>,
    /// The image as the pod names it, and the digest its container runs.
    pub image: Option<String>,
    pub image_digest: Option<String>,
}

/// Entries a source listed that are not `host:port` addresses, skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rejected {
    pub count: usize,
    /// The first few, quoted (escaped), each with why it was refused.
    pub examples: Vec<String>,
}

/// One successful read of a replica list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Found {
    /// Sorted, without duplicates, at most `max_replicas`.
    pub replicas: Vec<Replica>,
    /// Distinct replicas listed beyond `max_replicas`: the last ones in
    /// address order, not probed.
    pub over_limit: usize,
    pub rejected: Rejected,
    /// A watched source: its failures since the last read (each counted),
    /// and what fails while it does (`None` once its watches work).
    pub failed: u64,
    pub failing: Option<String>,
    /// A watched source: the ready pods per image, as the API lists them.
    pub images: Vec<kubernetes::ImagePods>,
    /// A watched source that has not listed yet: `replicas` is no list
    /// (the last one is kept), only the failures count.
    pub unlisted: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("DNS lookup of {name}: {message}")]
    Dns { name: String, message: String },
    #[error("DNS lookup of {0}: no A or AAAA records")]
    NoRecords(String),
    #[error("file_sd {path}: {message}")]
    FileSd { path: String, message: String },
    #[error("DNS resolver: {0}")]
    Resolver(String),
}

/// Reads one target's replica list.
pub struct Discovery {
    source: Source,
    scheme: String,
    max_replicas: usize,
}

/// Where the list is read from, ready to read.
enum Source {
    /// Written in the configuration: read once.
    Static(Vec<Replica>),
    Dns {
        // Boxed: a resolver is large, and there is one per target.
        resolver: Box<TokioResolver>,
        name: String,
        port: u16,
    },
    FileSd(std::path::PathBuf),
    Kubernetes(kubernetes::KubernetesWatch),
}

impl Discovery {
    pub fn new(config: &ReplicasConfig) -> Result<Self, DiscoveryError> {
        let source = match &config.source {
            ReplicaSource::Static(urls) => {
                Source::Static(urls.iter().filter_map(|u| of_url(u)).collect())
            }
            ReplicaSource::Dns {
                name,
                port,
                name_server,
            } => Source::Dns {
                resolver: Box::new(resolver(*name_server)?),
                name: name.clone(),
                port: *port,
            },
            ReplicaSource::FileSd(path) => Source::FileSd(path.clone()),
            ReplicaSource::Kubernetes(k) => Source::Kubernetes(kubernetes::KubernetesWatch::start(
                k.clone(),
                config.scheme.clone(),
                config.max_replicas,
            )),
        };
        Ok(Discovery {
            source,
            scheme: config.scheme.clone(),
            max_replicas: config.max_replicas,
        })
    }

    /// Notified when a watched source's list changes; `None`: the source
    /// is read again every `refresh` instead.
    pub fn changes(&self) -> Option<std::sync::Arc<tokio::sync::Notify>> {
        match &self.source {
            Source::Kubernetes(watch) => Some(watch.changes()),
            _ => None,
        }
    }

    /// The replicas now, sorted, without duplicates, and the first
    /// `max_replicas` of them only: the same ones from one read to the
    /// next, so that the cap does not move probes from replica to replica.
    pub async fn read(&self) -> Result<Found, DiscoveryError> {
        if let Source::Kubernetes(watch) = &self.source {
            let listing = watch.read();
            return Ok(Found {
                // Before the first list there is none to give: an empty
                // list would say "no replicas" rather than "not known yet".
                unlisted: listing.replicas.is_none(),
                replicas: listing.replicas.unwrap_or_default(),
                over_limit: listing.over_limit,
                rejected: listing.rejected,
                failed: listing.failed,
                failing: listing.failing,
                images: listing.images,
            });
        }
        let (mut replicas, rejected) = match &self.source {
            Source::Static(replicas) => (replicas.clone(), Rejected::default()),
            Source::Dns {
                resolver,
                name,
                port,
            } => (
                self.lookup(resolver, name, *port).await?,
                Rejected::default(),
            ),
            Source::FileSd(path) => {
                let (addresses, rejected) = file_sd::read(path).await?;
                let replicas = addresses
                    .into_iter()
                    .map(|address| self.of_address(&address))
                    .collect();
                (replicas, rejected)
            }
            Source::Kubernetes(_) => (Vec::new(), Rejected::default()),
        };
        replicas.sort();
        // One worker per label: two addresses of one host and port
        // (`http://h` and `http://h:80`) would each take the label's
        // worker from the other at every read.
        replicas.dedup_by(|a, b| a.label == b.label);
        let over_limit = replicas.len().saturating_sub(self.max_replicas);
        replicas.truncate(self.max_replicas);
        Ok(Found {
            replicas,
            over_limit,
            rejected,
            ..Found::default()
        })
    }

    async fn lookup(
        &self,
        resolver: &TokioResolver,
        name: &str,
        port: u16,
    ) -> Result<Vec<Replica>, DiscoveryError> {
        let found = resolver
            .lookup_ip(name)
            .await
            .map_err(|e| DiscoveryError::Dns {
                name: name.to_owned(),
                message: crate::text::clean(&e.to_string(), crate::text::MAX_MESSAGE_LEN),
            })?;
        let ips: Vec<IpAddr> = found.iter().collect();
        // An empty answer is taken as a failed read, not as "no replicas":
        // a DNS hiccup must not drop every replica's series.
        if ips.is_empty() {
            return Err(DiscoveryError::NoRecords(name.to_owned()));
        }
        Ok(ips
            .into_iter()
            .map(|ip| self.of_address(&SocketAddr::new(ip, port).to_string()))
            .collect())
    }

    fn of_address(&self, address: &str) -> Replica {
        Replica {
            label: address.to_owned(),
            base_url: format!("{}://{address}", self.scheme),
            placement: None,
        }
    }
}

/// A replica written as a URL; its label is the URL's `host:port`.
fn of_url(url: &str) -> Option<Replica> {
    let parsed = reqwest::Url::parse(url).ok()?;
    // IPv6 hosts come bracketed, as a label must write them.
    let host = parsed.host_str()?;
    let port = parsed.port_or_known_default()?;
    Some(Replica {
        label: format!("{host}:{port}"),
        base_url: url.trim_end_matches('/').to_owned(),
        placement: None,
    })
}

/// A resolver that asks `name_server` (or the system's) every time: the
/// list is read once per refresh, and a cached answer would hide a change.
fn resolver(name_server: Option<SocketAddr>) -> Result<TokioResolver, DiscoveryError> {
    let provider = TokioRuntimeProvider::default();
    let mut builder = match name_server {
        Some(address) => {
            let mut server = NameServerConfig::udp_and_tcp(address.ip());
            for connection in &mut server.connections {
                connection.port = address.port();
            }
            TokioResolver::builder_with_config(
                ResolverConfig::from_name_servers(vec![server]),
                provider,
            )
        }
        None => {
            TokioResolver::builder(provider).map_err(|e| DiscoveryError::Resolver(e.to_string()))?
        }
    };
    let options: &mut ResolverOpts = builder.options_mut();
    options.cache_size = 0;
    options.attempts = 1;
    options.timeout = std::time::Duration::from_secs(5);
    builder
        .build()
        .map_err(|e| DiscoveryError::Resolver(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_static_replica_is_labelled_by_its_host_and_port() {
        let r = of_url("http://10.0.0.5:8000/").unwrap();
        assert_eq!(r.label, "10.0.0.5:8000");
        assert_eq!(r.base_url, "http://10.0.0.5:8000");
        assert_eq!(
            of_url("https://vllm-0.example").unwrap().label,
            "vllm-0.example:443"
        );
        assert_eq!(of_url("http://[::1]:9000").unwrap().label, "[::1]:9000");
    }

    #[tokio::test]
    async fn the_first_replicas_in_address_order_are_kept_up_to_the_cap() {
        let urls = [
            "http://10.0.0.9:1",
            "http://10.0.0.1:1",
            // One replica written twice: one worker.
            "HTTP://10.0.0.1:1",
            "http://10.0.0.5:1",
        ];
        let config = ReplicasConfig {
            source: ReplicaSource::Static(urls.map(str::to_owned).to_vec()),
            refresh: std::time::Duration::from_secs(30),
            probe: crate::config::ProbeMode::Replicas,
            max_parallel: 1,
            scheme: "http".into(),
            max_replicas: 2,
        };
        let found = Discovery::new(&config).unwrap().read().await.unwrap();
        let labels: Vec<&str> = found.replicas.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(labels, ["10.0.0.1:1", "10.0.0.5:1"]);
        assert_eq!((found.over_limit, found.rejected.count), (1, 0));
    }
}
