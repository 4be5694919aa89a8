use crate::TransportError;
use std::fmt;

/// A parsed endpoint string.
///
/// | form | backend |
/// |---|---|
/// | `local://name` | crossbeam queues inside this process (always built) |
/// | `inproc://name` | libzmq inproc (feature `zmq`) |
/// | `tcp://host:port` | libzmq tcp (feature `zmq`); port 0 on bind picks a free port |
/// | `mpi://rank` | MPI under `mpirun` (feature `mpi`) |
///
/// # Examples
///
/// ```
/// use switchyard_transports::Endpoint;
/// # fn main() -> Result<(), switchyard_transports::TransportError> {
/// assert_eq!(Endpoint::parse("tcp://127.0.0.1:0")?, Endpoint::Tcp { host: "127.0.0.1".into(), port: 0 });
/// assert!(Endpoint::parse("udp://x").is_err());
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Endpoint {
    /// `local://name`
    Local(String),
    /// `inproc://name`
    Inproc(String),
    /// `tcp://host:port`
    Tcp {
        /// Host name or IP address.
        host: String,
        /// Port; 0 asks the operating system for one when binding.
        port: u16,
    },
    /// `mpi://rank`
    Mpi(u32),
}

impl Endpoint {
    /// Parses an endpoint string.
    pub fn parse(endpoint: &str) -> Result<Endpoint, TransportError> {
        let invalid = |reason: &str| TransportError::InvalidEndpoint {
            endpoint: endpoint.to_string(),
            reason: reason.to_string(),
        };
        let (scheme, rest) = endpoint
            .split_once("://")
            .ok_or_else(|| invalid("expected scheme://address"))?;
        match scheme {
            "local" | "inproc" => {
                if rest.is_empty() {
                    return Err(invalid("empty name"));
                }
                Ok(if scheme == "local" {
                    Endpoint::Local(rest.to_string())
                } else {
                    Endpoint::Inproc(rest.to_string())
                })
            }
            "tcp" => {
                let (host, port) = rest
                    .rsplit_once(':')
                    .ok_or_else(|| invalid("expected tcp://host:port"))?;
                if host.is_empty() {
                    return Err(invalid("empty host"));
                }
                let port = port
                    .parse::<u16>()
                    .map_err(|_| invalid("port is not a number from 0 to 65535"))?;
                Ok(Endpoint::Tcp {
                    host: host.to_string(),
                    port,
                })
            }
            "mpi" => rest
                .parse::<u32>()
                .map(Endpoint::Mpi)
                .map_err(|_| invalid("expected mpi://RANK with a non-negative rank")),
            _ => Err(invalid(
                "unknown scheme; use local://, inproc://, tcp:// or mpi://",
            )),
        }
    }

    /// The backends compiled into this build, for error messages.
    pub fn built_backends() -> &'static str {
        match (cfg!(feature = "zmq"), cfg!(feature = "mpi")) {
            (true, true) => "local, zmq (inproc, tcp), mpi",
            (true, false) => "local, zmq (inproc, tcp)",
            (false, true) => "local, mpi",
            (false, false) => "local",
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Local(name) => write!(f, "local://{name}"),
            Endpoint::Inproc(name) => write!(f, "inproc://{name}"),
            Endpoint::Tcp { host, port } => write!(f, "tcp://{host}:{port}"),
            Endpoint::Mpi(rank) => write!(f, "mpi://{rank}"),
        }
    }
}
