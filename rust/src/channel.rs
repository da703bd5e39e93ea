//! One broker endpoint as a client and a worker both talk to it: the socket set up once, every
//! message sent with the token and packed into batches, every message received read by the wire.
//!
//! An [`Endpoint`] is what it takes to (re)open the connection — a broker's addresses (its primary,
//! then its standbys), the token, the CURVE key, the socket's options — and [`Endpoint::open`] gives
//! a [`Channel`] over a fresh DEALER (src/transport.rs). The client's connection (src/client/) and
//! the worker's session (src/worker/) differ in what they say over it, not in how it is made: both
//! watch handshakes with the socket monitor; a client also asks libzmq for ZMTP heartbeats, since it
//! may sit idle while its requests wait, where a worker heartbeats in the protocol itself.

use crate::address;
use crate::error::{Error, Result};
use crate::transport::{curve_public_key, Dealer, Options};
use crate::wire::{self, Direction, Header, BATCH_BYTES};

/// What a message to send is: its encoded header, and its body (a msgpack document) if it has one.
pub(crate) type Outgoing = (Vec<u8>, Option<Vec<u8>>);

/// ZMTP heartbeats of a client's socket (milliseconds: interval, timeout), so a broker whose host
/// vanished is noticed while requests wait.
const CLIENT_HEARTBEAT: (i32, i32) = (1000, 5000);

/// Where a client's or worker's token comes from. Its `Debug` never shows the secret.
#[derive(Clone, Default)]
pub(crate) enum Token {
    /// None: an open broker.
    #[default]
    None,
    /// The secret's bytes, as given.
    Given(Vec<u8>),
    /// The environment variable that holds it, read when the connection is made.
    Env(String),
}

impl Token {
    /// The secret's bytes; [`Error::MissingToken`] for a variable that is not set.
    pub fn resolve(&self) -> Result<Vec<u8>> {
        match self {
            Token::None => Ok(Vec::new()),
            Token::Given(bytes) => Ok(bytes.clone()),
            Token::Env(variable) => match std::env::var_os(variable) {
                Some(value) if !value.is_empty() => Ok(value.into_encoded_bytes()),
                _ => Err(Error::MissingToken { variable: variable.clone() }),
            },
        }
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Token::None => f.write_str("None"),
            Token::Given(_) => f.write_str("Given(..)"),
            Token::Env(variable) => f.debug_tuple("Env").field(variable).finish(),
        }
    }
}

/// Everything it takes to open a connection to one broker's client or worker endpoint.
#[derive(Debug, Clone)]
pub(crate) struct Endpoint {
    /// The broker's addresses: its primary's, then its standbys'.
    pub addresses: Vec<String>,
    token: Vec<u8>,
    options: Options,
    /// What the broker sends on this endpoint.
    direction: Direction,
}

impl Endpoint {
    /// A broker's client endpoint: replies come back. `addresses` as the user gave them (a
    /// primary, then its standbys; see [`Addresses`](crate::Addresses)), `curve_server_key` as 40
    /// Z85 characters or a `NAME.key` file. `InvalidArgument` for no address or a bad key.
    pub async fn client(addresses: &[String], token: Vec<u8>, curve_server_key: Option<&str>) -> Result<Endpoint> {
        let addresses = address::parse(addresses, "broker address")?;
        let curve_server_key = match curve_server_key {
            Some(key) => Some(curve_public_key(key).await?),
            None => None,
        };
        let options = Options { curve_server_key, monitor: true, heartbeat: Some(CLIENT_HEARTBEAT) };
        Ok(Endpoint { addresses, token, options, direction: Direction::ClientReply })
    }

    /// A broker's worker endpoint: commands come. The monitor's handshakes tell the worker to
    /// register on every new connection (a restarted broker, or a standby that took over, does not
    /// know it; a `ready` sent while none was up was dropped).
    pub async fn worker(addresses: &[String], token: Vec<u8>, curve_server_key: Option<&str>) -> Result<Endpoint> {
        let addresses = address::parse(addresses, "broker address")?;
        let curve_server_key = match curve_server_key {
            Some(key) => Some(curve_public_key(key).await?),
            None => None,
        };
        let options = Options { curve_server_key, monitor: true, heartbeat: None };
        Ok(Endpoint { addresses, token, options, direction: Direction::WorkerCommand })
    }

    /// This endpoint's kind, token and key at a cluster member's addresses, as its map lists them.
    pub fn member(&self, addresses: &[String]) -> Result<Endpoint> {
        let what = match self.direction {
            Direction::WorkerCommand => "cluster member worker address",
            _ => "cluster member address",
        };
        Ok(Endpoint { addresses: address::parse(addresses, what)?, ..self.clone() })
    }

    /// Every address, as messages name them ("A or B" for a primary and its standby).
    pub fn describe(&self) -> String {
        self.addresses.join(" or ")
    }

    /// A new socket connected (in the background) to every address. InvalidArgument for an address
    /// libzmq cannot use. Must be called inside a tokio runtime.
    pub fn open(&self) -> Result<Channel> {
        let dealer = Dealer::connect(&self.addresses, &self.options)?;
        Ok(Channel { dealer, token: self.token.clone(), direction: self.direction })
    }
}

/// An open connection to one broker endpoint, used by the one task that owns it.
pub(crate) struct Channel {
    /// The socket: its descriptors to sleep on, and the state of its links.
    pub dealer: Dealer,
    token: Vec<u8>,
    direction: Direction,
}

impl Channel {
    /// Send `items` in order, packed into batches, each message led by the token. Returns how many
    /// items libzmq took: the rest did not leave (no connection is up, or its send queue is full).
    pub fn send(&self, items: &[Outgoing]) -> usize {
        let mut sent = 0;
        for (frames, carried) in wire::pack(items, BATCH_BYTES) {
            let mut message = Vec::with_capacity(frames.len() + 1);
            message.push(self.token.clone());
            message.extend(frames);
            if !self.dealer.send(&message) {
                return sent;
            }
            sent += carried;
        }
        sent
    }

    /// The messages the next received ZeroMQ message carries (a batch item by item), if one is
    /// waiting; what cannot be read is left out (an empty list for a message none of which reads).
    pub fn recv(&self) -> Option<Vec<(Header, Option<Vec<u8>>)>> {
        let frames = self.dealer.try_recv()?;
        let (header, body) = match frames.as_slice() {
            [h] => (h.as_slice(), None),
            [h, b] => (h.as_slice(), Some(b.as_slice())),
            _ => return Some(Vec::new()),
        };
        let items = match wire::read(self.direction, header, body) {
            Ok(items) => items,
            Err((rid, error)) => {
                tracing::warn!(rid, %error, "a message from the broker could not be read; it is dropped");
                Vec::new()
            }
        };
        Some(items.into_iter().flatten().collect())
    }
}
