//! Clients that send the socket path as the HTTP/2 `:authority` (Python's grpcio,
//! grpc-java, grpcurl over a unix socket) are refused by the HTTP/2 server underneath
//! tonic (h2 resets the stream with PROTOCOL_ERROR before any handler runs), and h2
//! says so only in a debug line. kubelet and the Go sidecars send `localhost` and are
//! not affected.
//!
//! Accepting them would mean rewriting HPACK-encoded headers on the wire, under the
//! HTTP/2 library; instead this tracing layer watches for h2's own account of the
//! refusal and logs, once per process, what happened and how to fix the client.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::{Context, Filter, Layer};

/// What h2 logs (at debug, target `h2::server`) when it refuses an authority.
const H2_MARK: &str = "malformed authority";

/// The line logged once a refusal was seen.
pub const WARNING: &str = "a gRPC client was refused: it sent the socket path as the HTTP/2 :authority, which the HTTP/2 server rejects (PROTOCOL_ERROR); set the client's authority to `localhost` (grpcio: channel option grpc.default_authority; grpc-java: overrideAuthority; grpcurl: -authority localhost)";

/// Logs [`WARNING`] the first time h2 refuses a request's `:authority`.
pub struct RefusedAuthority {
    warned: AtomicBool,
    /// How the warning is told (a `tracing::warn!`: with the process's global
    /// subscriber, an event emitted while another is dispatched is delivered).
    tell: fn(&str),
}

impl RefusedAuthority {
    /// The layer with the filter it needs: h2's debug events only, whatever the
    /// log level of the rest.
    pub fn layer<S: Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>>()
    -> impl Layer<S> {
        RefusedAuthority::telling(|m| tracing::warn!("{m}")).with_filter(Self::filter())
    }

    fn telling(tell: fn(&str)) -> RefusedAuthority {
        RefusedAuthority {
            warned: AtomicBool::new(false),
            tell,
        }
    }

    fn filter<S>() -> impl Filter<S> {
        Targets::new().with_target("h2::server", LevelFilter::DEBUG)
    }

    /// Whether the event is h2's account of a refused authority.
    fn is_refusal(event: &Event<'_>) -> bool {
        struct Message(bool);
        impl Visit for Message {
            fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
                if field.name() == "message" && format!("{value:?}").contains(H2_MARK) {
                    self.0 = true;
                }
            }
        }
        let mut m = Message(false);
        event.record(&mut m);
        m.0
    }
}

impl<S: Subscriber> Layer<S> for RefusedAuthority {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if Self::is_refusal(event) && !self.warned.swap(true, Ordering::Relaxed) {
            (self.tell)(WARNING);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use tracing_subscriber::layer::SubscriberExt;

    static TOLD: Mutex<Vec<String>> = Mutex::new(Vec::new());

    #[test]
    fn warns_once_when_h2_refuses_an_authority() {
        let layer = RefusedAuthority::telling(|m| TOLD.lock().unwrap().push(m.to_string()))
            .with_filter(RefusedAuthority::filter());
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..2 {
                tracing::debug!(target: "h2::server", "malformed headers: malformed authority (\"/run/x.sock\"): invalid uri character");
            }
            tracing::debug!(target: "h2::server", "malformed headers: :status field on request");
            tracing::debug!(target: "other", "malformed authority");
        });
        let told = TOLD.lock().unwrap();
        assert_eq!(told.len(), 1, "{told:?}");
        assert!(told[0].contains("grpc.default_authority"));
    }
}
