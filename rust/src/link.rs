//! What a socket monitor says about a DEALER's link to a broker, in words a user can act on.
//!
//! libzmq connects, reconnects and handshakes by itself and tells the sender nothing: a request to a
//! broker that is down, or that speaks CURVE with another key, simply waits. The socket's monitor
//! reports each step; [`Links`] turns those events into the state of the link and, while it fails,
//! a sentence naming why. No I/O here: the socket's owner feeds in the events and the time.
//!
//! Waiting is pointless ([`Links::hopeless`]), as the Python client judges it:
//!
//! - on a mechanism mismatch (one side encrypted, the other not) at once: libzmq does not try again;
//! - after [`HANDSHAKE_FAILURES_FINAL`] handshakes in a row fail without saying why: with a CURVE
//!   key, that is a broker holding another key pair, and waiting changes nothing (one such failure
//!   is not enough: a broker often drops a peer of the other kind before it reads why);
//! - on refused connections only while the link has never been up, once they have gone on for
//!   [`REFUSED_GRACE`]: a broker started a moment after its client still gets the requests, and a
//!   link that was up is taken to be restarting (its requests wait, bounded by request_timeout).
//!
//! A settled trouble stays until a handshake succeeds. With a primary and its standbys the socket is
//! as good as its best link: hopeless only when every address is.

use std::collections::HashMap;
use std::net::ToSocketAddrs;
use std::time::{Duration, Instant};

/// Refused connections, on a link never up, before its requests fail instead of waiting.
pub(crate) const REFUSED_GRACE: Duration = Duration::from_secs(1);

/// Handshakes failing in a row, without a reason, that settle it (about 1.5 s of libzmq's retries).
pub(crate) const HANDSHAKE_FAILURES_FINAL: u32 = 10;

const KEY_OPTION: &str = "curve_server_key";

/// The monitor events a link reads.
pub(crate) fn events() -> i32 {
    use crate::libzmq::event as E;
    [
        E::CONNECTED,
        E::CONNECT_RETRIED,
        E::DISCONNECTED,
        E::HANDSHAKE_SUCCEEDED,
        E::HANDSHAKE_FAILED_NO_DETAIL,
        E::HANDSHAKE_FAILED_PROTOCOL,
        E::HANDSHAKE_FAILED_AUTH,
    ]
    .iter()
    .fold(0, |all, e| all | i32::from(*e))
}

/// libzmq's `ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH` (the value of a HANDSHAKE_FAILED_PROTOCOL).
const MECHANISM_MISMATCH: u32 = 0x1100_0002;

/// A monitor event: its kind and value (libzmq's `zmq_event_t`) and the endpoint it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Event {
    pub kind: u16,
    pub value: u32,
    pub endpoint: String,
}

impl Event {
    /// Read a monitor message: a frame of the event (u16) and value (u32), little-endian, then the
    /// endpoint's frame.
    pub fn parse(frames: &[Vec<u8>]) -> Option<Event> {
        let first = frames.first().filter(|f| f.len() >= 6)?;
        Some(Event {
            kind: u16::from_le_bytes([first[0], first[1]]),
            value: u32::from_le_bytes([first[2], first[3], first[4], first[5]]),
            endpoint: String::from_utf8_lossy(frames.get(1).map_or(&[][..], |f| f.as_slice())).into_owned(),
        })
    }

    pub fn is(&self, kind: u16) -> bool {
        self.kind == kind
    }
}

/// The link of one DEALER to one broker address.
#[derive(Debug, Clone)]
struct Link {
    address: String,
    encrypted: bool,
    /// Handshakes that succeeded, over the link's life.
    handshakes: usize,
    /// A handshake succeeded and the connection has not ended since.
    up: bool,
    /// Why the link is failing right now; None while it is up or has not failed.
    trouble: Option<String>,
    trouble_since: Option<Instant>,
    /// The trouble is of the kind waiting cannot mend (a CURVE mistake).
    fatal: bool,
    /// The current attempt's TCP connection was made.
    reached: bool,
    /// The trouble is refused connections, which a starting broker ends.
    refusing: bool,
    handshake_failures: u32,
}

impl Link {
    fn new(address: &str, encrypted: bool) -> Link {
        Link {
            address: address.to_string(),
            encrypted,
            handshakes: 0,
            up: false,
            trouble: None,
            trouble_since: None,
            fatal: false,
            reached: false,
            refusing: false,
            handshake_failures: 0,
        }
    }

    fn observe(&mut self, event: &Event, now: Instant) {
        use crate::libzmq::event as E;
        if event.is(E::HANDSHAKE_SUCCEEDED) {
            self.handshakes += 1;
            self.up = true;
            self.trouble = None;
            self.trouble_since = None;
            self.fatal = false;
            self.refusing = false;
            self.handshake_failures = 0;
        } else if event.is(E::CONNECTED) {
            self.reached = true;
        } else if event.is(E::DISCONNECTED) {
            self.up = false;
        } else if event.is(E::CONNECT_RETRIED) {
            // libzmq tries again after an attempt that failed or a connection that ended: only the
            // first means nobody took the connection.
            if !self.reached {
                let why = format!("connection refused at {}: is a broker running there?", self.address);
                self.fail(why, now, false, true);
            }
            self.reached = false;
        } else if event.is(E::HANDSHAKE_FAILED_PROTOCOL) && event.value == MECHANISM_MISMATCH {
            let why = self.mismatch();
            self.fail(why, now, true, false);
        } else if event.is(E::HANDSHAKE_FAILED_AUTH) {
            let why =
                format!("the broker at {} refused the handshake (authentication status {})", self.address, event.value);
            self.fail(why, now, true, false);
        } else if event.is(E::HANDSHAKE_FAILED_PROTOCOL) || event.is(E::HANDSHAKE_FAILED_NO_DETAIL) {
            self.handshake_failures += 1;
            let why = if self.encrypted { self.wrong_key() } else { self.dropped() };
            let fatal = self.handshake_failures >= HANDSHAKE_FAILURES_FINAL;
            self.fail(why, now, fatal, false);
        }
    }

    fn hopeless(&self, now: Instant) -> Option<&str> {
        let trouble = self.trouble.as_deref()?;
        let refused_long = self.refusing
            && self.handshakes == 0
            && self.trouble_since.is_some_and(|since| now.saturating_duration_since(since) >= REFUSED_GRACE);
        (self.fatal || refused_long).then_some(trouble)
    }

    fn silence(&self, what: &str) -> String {
        if let Some(trouble) = &self.trouble {
            format!("{what}: {trouble}")
        } else if self.up {
            format!("{what}; the connection is up: is the broker stalled or overloaded?")
        } else if self.reached {
            format!(
                "{what}: the connection was made but its ZeroMQ handshake never completed; is a cronoq broker \
                 listening there?"
            )
        } else if self.handshakes == 0 {
            format!("{what}: no connection could be made; is the address right, and reachable from here?")
        } else {
            format!("{what}; is it running?")
        }
    }

    fn fail(&mut self, trouble: String, now: Instant, fatal: bool, refused: bool) {
        if self.fatal {
            return; // settled: kept until a handshake succeeds
        }
        if self.trouble.is_none() {
            self.trouble_since = Some(now);
        }
        self.trouble = Some(trouble);
        self.fatal = fatal;
        self.refusing = refused;
    }

    fn mismatch(&self) -> String {
        if self.encrypted {
            format!(
                "the broker at {} is not encrypted, but a CURVE public key was given ({KEY_OPTION}): leave it out, \
                 or give the broker a curve_secret_key_file",
                self.address
            )
        } else {
            format!(
                "the broker at {} is encrypted (CURVE): give its public key ({KEY_OPTION}), the NAME.key file \
                 `cronoq keygen` wrote with its secret key",
                self.address
            )
        }
    }

    fn dropped(&self) -> String {
        format!(
            "the broker at {} dropped the connection during the handshake: if it is encrypted (CURVE), give its \
             public key ({KEY_OPTION}); if not, is this a cronoq broker's endpoint, with room for another \
             connection (max_connections)?",
            self.address
        )
    }

    fn wrong_key(&self) -> String {
        format!(
            "CURVE handshake with {} failed: the public key given ({KEY_OPTION}) is not this broker's; give the \
             NAME.key written with its curve_secret_key_file (or leave the key out, if the broker is not encrypted)",
            self.address
        )
    }
}

/// The links of one DEALER connected to every address of one broker (its primary and standbys).
#[derive(Debug, Clone)]
pub(crate) struct Links {
    links: Vec<Link>,
    /// Monitor endpoints already matched to a link (libzmq may spell a host resolved).
    by_endpoint: HashMap<String, usize>,
}

impl Links {
    pub fn new(addresses: &[String], encrypted: bool) -> Links {
        let links: Vec<Link> = addresses.iter().map(|a| Link::new(a, encrypted)).collect();
        let by_endpoint = addresses.iter().enumerate().map(|(i, a)| (a.clone(), i)).collect();
        Links { links, by_endpoint }
    }

    /// Some link's handshake succeeded and its connection has not ended since.
    pub fn up(&self) -> bool {
        self.links.iter().any(|l| l.up)
    }

    /// Take one monitor event that happened at `now`.
    pub fn observe(&mut self, event: &Event, now: Instant) {
        if let Some(i) = self.link_for(&event.endpoint) {
            self.links[i].observe(event, now);
        }
    }

    /// Why requests should fail now rather than wait: every link is hopeless (see the module's rules).
    pub fn hopeless(&self, now: Instant) -> Option<String> {
        if self.up() {
            return None;
        }
        let reasons: Option<Vec<&str>> = self.links.iter().map(|l| l.hopeless(now)).collect();
        reasons.map(|r| r.join("; "))
    }

    /// Why serving cannot start: no address was ever reached and each fails in a way waiting cannot
    /// mend (a CURVE mistake); None otherwise. A worker stops on it, as the Python worker does.
    pub fn fatal(&self) -> Option<String> {
        if self.links.iter().any(|l| l.handshakes > 0 || !l.fatal) {
            return None;
        }
        let troubles: Vec<&str> = self.links.iter().filter_map(|l| l.trouble.as_deref()).collect();
        Some(troubles.join("; "))
    }

    /// Why `what` (e.g. "no reply from the broker at ADDR within 30 s") came to nothing.
    pub fn silence(&self, what: &str) -> String {
        if self.links.len() == 1 {
            return self.links[0].silence(what);
        }
        if let Some(live) = self.links.iter().find(|l| l.up) {
            return live.silence(what);
        }
        let troubles: Vec<&str> = self.links.iter().filter_map(|l| l.trouble.as_deref()).collect();
        if troubles.len() == self.links.len() {
            return format!("{what}: {}", troubles.join("; "));
        }
        let all: Vec<&str> = self.links.iter().map(|l| l.address.as_str()).collect();
        format!("{what}: none of {} answers; is a broker (or its standby) running there?", all.join(", "))
    }

    fn link_for(&mut self, endpoint: &str) -> Option<usize> {
        if let Some(i) = self.by_endpoint.get(endpoint) {
            return Some(*i);
        }
        if self.links.len() == 1 {
            return Some(0);
        }
        // Another spelling of one of ours: the same port with the host resolved.
        let port = |a: &str| a.rsplit(':').next().unwrap_or("").to_string();
        let same_port: Vec<usize> =
            (0..self.links.len()).filter(|i| port(&self.links[*i].address) == port(endpoint)).collect();
        let found = if same_port.len() == 1 { Some(same_port[0]) } else { self.resolved(endpoint, &same_port) };
        if let Some(i) = found {
            self.by_endpoint.insert(endpoint.to_string(), i);
        }
        found
    }

    /// The link among `candidates` whose host name resolves to `endpoint`'s host.
    fn resolved(&self, endpoint: &str, candidates: &[usize]) -> Option<usize> {
        let host_of = |a: &str| {
            let rest = a.split_once("://").map_or(a, |(_, r)| r);
            rest.rsplit_once(':').map_or(rest, |(h, _)| h).trim_matches(|c| c == '[' || c == ']').to_string()
        };
        let host = host_of(endpoint);
        candidates.iter().copied().find(|i| {
            let theirs = host_of(&self.links[*i].address);
            (theirs.as_str(), 0).to_socket_addrs().is_ok_and(|mut all| all.any(|a| a.ip().to_string() == host))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::libzmq::event as E;

    fn event(kind: u16, value: u32, endpoint: &str) -> Event {
        Event { kind, value, endpoint: endpoint.to_string() }
    }

    const A: &str = "tcp://127.0.0.1:5555";
    const B: &str = "tcp://127.0.0.1:6555";

    #[test]
    fn refused_connections_are_hopeless_after_the_grace_only_on_a_link_never_up() {
        let t0 = Instant::now();
        let mut links = Links::new(&[A.to_string()], false);
        links.observe(&event(E::CONNECT_RETRIED, 100, A), t0);
        assert_eq!(links.hopeless(t0), None);
        links.observe(&event(E::CONNECT_RETRIED, 100, A), t0 + REFUSED_GRACE);
        let why = links.hopeless(t0 + REFUSED_GRACE).expect("refused for the grace");
        assert!(why.contains("connection refused at tcp://127.0.0.1:5555"), "{why}");

        let mut was_up = Links::new(&[A.to_string()], false);
        was_up.observe(&event(E::HANDSHAKE_SUCCEEDED, 0, A), t0);
        was_up.observe(&event(E::DISCONNECTED, 0, A), t0);
        was_up.observe(&event(E::CONNECT_RETRIED, 100, A), t0);
        assert_eq!(was_up.hopeless(t0 + REFUSED_GRACE * 10), None, "a restarting broker is waited for");
        assert!(was_up.silence("no reply").contains("connection refused"));
    }

    #[test]
    fn curve_mistakes_settle_and_a_standby_refusing_is_no_trouble_while_the_primary_serves() {
        let t0 = Instant::now();
        let mut plain = Links::new(&[A.to_string()], false);
        plain.observe(&event(E::HANDSHAKE_FAILED_PROTOCOL, MECHANISM_MISMATCH, A), t0);
        assert!(plain.hopeless(t0).unwrap().contains("is encrypted (CURVE)"));
        assert_eq!(plain.fatal(), plain.hopeless(t0));
        let mut refused = Links::new(&[A.to_string()], false);
        refused.observe(&event(E::CONNECT_RETRIED, 100, A), t0);
        refused.observe(&event(E::CONNECT_RETRIED, 100, A), t0 + REFUSED_GRACE);
        assert!(refused.hopeless(t0 + REFUSED_GRACE).is_some() && refused.fatal().is_none(), "a worker waits");

        let mut keyed = Links::new(&[A.to_string()], true);
        for n in 1..=HANDSHAKE_FAILURES_FINAL {
            assert!(keyed.hopeless(t0).is_none(), "after {n} failures");
            keyed.observe(&event(E::CONNECTED, 0, A), t0);
            keyed.observe(&event(E::HANDSHAKE_FAILED_NO_DETAIL, 0, A), t0);
        }
        assert!(keyed.hopeless(t0).unwrap().contains("CURVE handshake with tcp://127.0.0.1:5555 failed"));

        let mut pair = Links::new(&[A.to_string(), B.to_string()], false);
        pair.observe(&event(E::HANDSHAKE_SUCCEEDED, 0, "tcp://localhost:5555"), t0);
        pair.observe(&event(E::CONNECT_RETRIED, 100, B), t0);
        pair.observe(&event(E::CONNECT_RETRIED, 100, B), t0 + REFUSED_GRACE * 2);
        assert!(pair.up());
        assert_eq!(pair.hopeless(t0 + REFUSED_GRACE * 2), None);
    }
}
