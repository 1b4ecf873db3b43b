//! An MQTT (3.1.1) topic filter, subscribed at QoS 1 in a persistent session (clean session
//! off, under the configured `client_id`) with manual acknowledgements: a PUBACK goes back
//! only after the commit holding the message's job. The broker keeps what was not
//! acknowledged in the session, and sends it again when a client with that id connects again
//! (after a restart, a cut link, or the loop reconnecting after an error).
//!
//! MQTT 3.1.1 gives a message no id that survives redelivery (packet ids are the link's, and
//! reused), so a message's identity is the SHA-256 of its topic and payload: a redelivered
//! message finds its job, and two messages with the same payload on the same topic become one
//! job.

use conveyor_core::sources::{BrokerSpec, Message, SourceSpec};
use rumqttc::{
    AsyncClient, ConnectReturnCode, Event, EventLoop, MqttOptions, Outgoing, Packet, Publish, QoS,
    SubscribeReasonCode,
};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::ingest::{Broker, BrokerError};

/// How long connecting and subscribing may take before it counts as failed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest packet MQTT can carry (its remaining length's limit): the source takes
/// whatever the broker accepted from publishers.
const MAX_PACKET: usize = 268_435_455;

/// Room for acknowledgements queued for the event loop before `ack` waits for it to send some.
const REQUESTS: usize = 1024;

/// How long `ack` waits for the broker to have taken its acknowledgements.
const ACK_TIMEOUT: Duration = Duration::from_secs(30);

/// The topic filter of the acknowledgement barrier (see [`Mqtt::barriers_passed`]).
const BARRIER: &str = "conveyor/ack-barrier";

pub(crate) struct Mqtt {
    client: AsyncClient,
    /// Publishes the event loop received, or the error that ended it.
    incoming: mpsc::UnboundedReceiver<Result<Publish, String>>,
    /// Polls the connection (reads, pings, sends the acknowledgements). On drop the source
    /// sends a DISCONNECT (after the acknowledgements queued before it) and leaves the loop a
    /// moment to send it: closing the socket at once, with data still unread, would reset the
    /// connection and could lose acknowledgements the broker had not read yet. The session
    /// and its unacknowledged messages stay at the broker either way.
    event_loop: Option<JoinHandle<()>>,
    /// Messages read and not yet acknowledged, in the order they came (MQTT wants PUBACKs in
    /// that order), by identity.
    held: VecDeque<(String, Publish)>,
    /// UNSUBACKs received, and UNSUBSCRIBEs sent, for the barrier `ack` puts after its
    /// PUBACKs: the broker handles a connection's packets in order, so its answer means it
    /// has taken every acknowledgement before it. A source stopped right after `ack` then
    /// leaves nothing unacknowledged (an acknowledgement lost on the way would only cost a
    /// redelivery, found as a duplicate).
    barriers_passed: watch::Receiver<u64>,
    barriers_sent: u64,
    /// A topic filter never subscribed to in this session: unsubscribing from it changes
    /// nothing.
    barrier: String,
}

/// How long a dropped source's event loop has to send what was queued and its DISCONNECT.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

impl Drop for Mqtt {
    fn drop(&mut self) {
        let Some(event_loop) = self.event_loop.take() else {
            return;
        };
        let disconnecting = self.client.try_disconnect().is_ok();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) if disconnecting => {
                runtime.spawn(async move {
                    let abort = event_loop.abort_handle();
                    if tokio::time::timeout(CLOSE_GRACE, event_loop).await.is_err() {
                        abort.abort();
                    }
                });
            }
            _ => event_loop.abort(),
        }
    }
}

/// Where to connect, from `mqtt://[user[:password]@]host[:port]` (or `tcp://`).
#[derive(Debug, PartialEq)]
struct Address {
    host: String,
    port: u16,
    credentials: Option<(String, String)>,
}

fn parse_url(url: &str) -> Result<Address, BrokerError> {
    let bad = |why: &str| BrokerError(format!("mqtt: the url is not usable: {why}"));
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad("it has no scheme (mqtt://host:port)"))?;
    match scheme {
        "mqtt" | "tcp" => {}
        "mqtts" => {
            return Err(bad(
                "mqtts:// (TLS) is not supported yet; connect over mqtt:// (a local TLS \
                 terminator, such as stunnel or the broker's plain listener on a private network)",
            ))
        }
        other => return Err(bad(&format!("the scheme {other}:// is not MQTT's"))),
    }
    // The authority ends at the first `/`, `?` or `#`; a path means nothing to MQTT.
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let (user_info, host_port) = match authority.rsplit_once('@') {
        Some((user_info, host_port)) => (Some(user_info), host_port),
        None => (None, authority),
    };
    let credentials = user_info.map(|info| {
        let (user, password) = info.split_once(':').unwrap_or((info, ""));
        (percent_decode(user), percent_decode(password))
    });
    let (host, port) = if let Some(bracketed) = host_port.strip_prefix('[') {
        // An IPv6 address: [::1]:1883.
        let (host, after) = bracketed
            .split_once(']')
            .ok_or_else(|| bad("an IPv6 address is missing its closing ]"))?;
        (host, after.strip_prefix(':'))
    } else {
        match host_port.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        }
    };
    if host.is_empty() {
        return Err(bad("it has no host"));
    }
    let port = match port {
        None | Some("") => 1883,
        Some(port) => port.parse().map_err(|_| {
            bad(&format!(
                "the port {port:?} is not a number from 1 to 65535"
            ))
        })?,
    };
    Ok(Address {
        host: host.to_string(),
        port,
        credentials,
    })
}

/// `%XX` escapes decoded (a password holding `@` or `:` is written escaped in a URL).
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(high), Some(low)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((high * 16 + low) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A message's identity: the SHA-256 (hex) of its topic and payload, length-prefixed.
fn identity(topic: &str, payload: &[u8]) -> String {
    let mut hash = Sha256::new();
    hash.update((topic.len() as u64).to_be_bytes());
    hash.update(topic.as_bytes());
    hash.update((payload.len() as u64).to_be_bytes());
    hash.update(payload);
    hash.finalize()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// Connects with the session's client id, subscribes, and starts polling the connection.
pub(crate) async fn connect(spec: &SourceSpec) -> Result<Box<dyn Broker>, BrokerError> {
    let BrokerSpec::Mqtt {
        topic, client_id, ..
    } = &spec.broker
    else {
        return Err(BrokerError("not an mqtt source".into()));
    };
    let url = spec
        .broker
        .resolve_url()
        .map_err(BrokerError)?
        .ok_or_else(|| BrokerError("mqtt: no url".into()))?;
    let address = parse_url(&url)?;
    let mut options = MqttOptions::new(client_id.clone(), address.host, address.port);
    options
        .set_clean_session(false)
        .set_manual_acks(true)
        .set_keep_alive(Duration::from_secs(30))
        .set_max_packet_size(MAX_PACKET, MAX_PACKET);
    if let Some((user, password)) = address.credentials {
        options.set_credentials(user, password);
    }
    let (client, mut event_loop) = AsyncClient::new(options, REQUESTS);
    let (sender, incoming) = mpsc::unbounded_channel();
    // Subscribing again in a session that has the subscription replaces it (and the broker
    // sends the topic's retained message again, which its identity recognises).
    client
        .subscribe(topic.as_str(), QoS::AtLeastOnce)
        .await
        .map_err(|error| BrokerError(format!("mqtt: subscribe to {topic:?}: {error}")))?;
    match tokio::time::timeout(CONNECT_TIMEOUT, subscribed(&mut event_loop, &sender, topic)).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => return Err(error),
        Err(_) => {
            return Err(BrokerError(format!(
                "mqtt: connecting and subscribing took more than {} s",
                CONNECT_TIMEOUT.as_secs()
            )))
        }
    }
    let (passed, barriers_passed) = watch::channel(0);
    let event_loop = tokio::spawn(poll(event_loop, sender, passed));
    Ok(Box::new(Mqtt {
        client,
        incoming,
        event_loop: Some(event_loop),
        held: VecDeque::new(),
        barriers_passed,
        barriers_sent: 0,
        barrier: if topic == BARRIER {
            format!("{BARRIER}/2")
        } else {
            BARRIER.to_string()
        },
    }))
}

/// Drives the connection until the broker grants the subscription; messages the session
/// held come meanwhile, and are passed on.
async fn subscribed(
    event_loop: &mut EventLoop,
    sender: &mpsc::UnboundedSender<Result<Publish, String>>,
    topic: &str,
) -> Result<(), BrokerError> {
    loop {
        let event = event_loop
            .poll()
            .await
            .map_err(|error| BrokerError(format!("mqtt: connect: {error}")))?;
        match event {
            Event::Incoming(Packet::ConnAck(ack)) if ack.code != ConnectReturnCode::Success => {
                return Err(BrokerError(format!(
                    "mqtt: the broker refused the connection: {:?}",
                    ack.code
                )))
            }
            Event::Incoming(Packet::SubAck(ack)) => {
                if ack
                    .return_codes
                    .iter()
                    .any(|code| matches!(code, SubscribeReasonCode::Failure))
                {
                    return Err(BrokerError(format!(
                        "mqtt: the broker refused the subscription to {topic:?}"
                    )));
                }
                return Ok(());
            }
            Event::Incoming(Packet::Publish(publish)) => {
                // The receiver is ours and alive here.
                let _ = sender.send(Ok(publish));
            }
            _ => {}
        }
    }
}

/// Polls the connection, passing publishes on, until it fails (the error is passed on and the
/// loop ends: the source reconnects with a new connection) or the source disconnects. Once the
/// source is gone, what arrives is dropped (the broker keeps it in the session).
async fn poll(
    mut event_loop: EventLoop,
    sender: mpsc::UnboundedSender<Result<Publish, String>>,
    passed: watch::Sender<u64>,
) {
    loop {
        match event_loop.poll().await {
            Ok(Event::Incoming(Packet::Publish(publish))) => {
                let _ = sender.send(Ok(publish));
            }
            Ok(Event::Incoming(Packet::UnsubAck(_))) => {
                passed.send_modify(|n| *n += 1);
            }
            Ok(Event::Outgoing(Outgoing::Disconnect)) => return,
            Ok(Event::Incoming(Packet::Disconnect)) => {
                let _ = sender.send(Err("the broker closed the connection".into()));
                return;
            }
            Ok(_) => {}
            Err(error) => {
                let _ = sender.send(Err(error.to_string()));
                return;
            }
        }
    }
}

#[async_trait::async_trait]
impl crate::ingest::OneAtATime for Mqtt {
    async fn next(&mut self, wait: Duration) -> Result<Option<Message>, BrokerError> {
        let publish = match tokio::time::timeout(wait, self.incoming.recv()).await {
            Err(_) => return Ok(None),
            Ok(None) => return Err(BrokerError("mqtt: the connection ended".into())),
            Ok(Some(Err(error))) => return Err(BrokerError(format!("mqtt: {error}"))),
            Ok(Some(Ok(publish))) => publish,
        };
        let identity = identity(&publish.topic, &publish.payload);
        let message = Message {
            identity: identity.clone(),
            sent_at: None,
            headers: BTreeMap::new(),
            subject: Some(publish.topic.clone()),
            body: publish.payload.to_vec(),
        };
        // Held at once, so a receive cancelled later still acknowledges it in order.
        self.held.push_back((identity, publish));
        Ok(Some(message))
    }
}

#[async_trait::async_trait]
impl Broker for Mqtt {
    async fn receive(&mut self, max: usize) -> Result<Vec<Message>, BrokerError> {
        crate::ingest::gather(self, max).await
    }

    /// Sends a PUBACK for every message held under these identities, in the order they came,
    /// and waits until the broker has taken them.
    async fn ack(&mut self, identities: &[String]) -> Result<(), BrokerError> {
        let acked: HashSet<&String> = identities.iter().collect();
        let mut kept = VecDeque::with_capacity(self.held.len());
        let mut result = Ok(());
        let mut sent = false;
        while let Some((identity, publish)) = self.held.pop_front() {
            if result.is_ok() && acked.contains(&identity) {
                result = self
                    .client
                    .ack(&publish)
                    .await
                    .map_err(|error| BrokerError(format!("mqtt: acknowledge: {error}")));
                if result.is_ok() {
                    // A message that came at QoS 0 has nothing to acknowledge.
                    sent |= publish.qos != QoS::AtMostOnce;
                    continue;
                }
            }
            kept.push_back((identity, publish));
        }
        self.held = kept;
        result?;
        if !sent {
            return Ok(());
        }
        self.client
            .unsubscribe(self.barrier.as_str())
            .await
            .map_err(|error| BrokerError(format!("mqtt: acknowledge: {error}")))?;
        self.barriers_sent += 1;
        let sent = self.barriers_sent;
        let passed = self.barriers_passed.wait_for(|n| *n >= sent);
        match tokio::time::timeout(ACK_TIMEOUT, passed).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(BrokerError(
                "mqtt: acknowledge: the connection ended before the broker confirmed it".into(),
            )),
            Err(_) => Err(BrokerError(format!(
                "mqtt: acknowledge: the broker did not confirm it within {} s",
                ACK_TIMEOUT.as_secs()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_give_host_port_and_credentials() {
        assert_eq!(
            parse_url("mqtt://127.0.0.1:1883").ok(),
            Some(Address {
                host: "127.0.0.1".into(),
                port: 1883,
                credentials: None
            })
        );
        assert_eq!(
            parse_url("tcp://broker.example/").ok(),
            Some(Address {
                host: "broker.example".into(),
                port: 1883,
                credentials: None
            })
        );
        assert_eq!(
            parse_url("mqtt://user:p%40ss%3Aword@[::1]:8883").ok(),
            Some(Address {
                host: "::1".into(),
                port: 8883,
                credentials: Some(("user".into(), "p@ss:word".into()))
            })
        );
        assert_eq!(
            parse_url("mqtt://user@host:1").ok(),
            Some(Address {
                host: "host".into(),
                port: 1,
                credentials: Some(("user".into(), "".into()))
            })
        );
    }

    #[test]
    fn unusable_urls_say_why() {
        for (url, why) in [
            ("mqtts://host", "not supported"),
            ("mqtt://host:http", "not a number"),
            ("mqtt://:1883", "no host"),
            ("amqp://host", "not MQTT"),
            ("host:1883", "no scheme"),
        ] {
            let error = parse_url(url).err().map(|e| e.0).unwrap_or_default();
            assert!(error.contains(why), "{url}: {error}");
        }
    }

    #[test]
    fn the_identity_is_the_topic_and_payload() {
        assert_eq!(identity("a/b", b"{}"), identity("a/b", b"{}"));
        assert_ne!(identity("a/b", b"{}"), identity("a/c", b"{}"));
        assert_ne!(identity("a", b"b{}"), identity("ab", b"{}"));
        assert_eq!(identity("a", b"").len(), 64);
    }
}
