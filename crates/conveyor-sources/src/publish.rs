//! Publishing to a source's broker, as a producer would: what `conveyor bench --workload ingest`
//! uses to fill a stream, queue or topic before a source reads it, and to measure the broker's
//! own publish rate beside the source's ingest rate.
//!
//! - [`prepare`] makes what the source names, empty: a Redis stream and its consumer group, a
//!   durable RabbitMQ queue, a JetStream stream (file storage), an MQTT persistent session
//!   subscribed to the topic, an SQS queue, a Kafka topic of [`KAFKA_PARTITIONS`] partitions.
//! - [`Publisher::send`] returns once the broker has confirmed every message: XADD replies,
//!   publisher confirms (persistent messages, mandatory routing), JetStream publish acks, QoS 1
//!   PUBACKs, SendMessageBatch results, Kafka produce acks (`acks = all`).
//! - [`remove`] deletes what [`prepare`] made.
//!
//! Each broker's publisher is behind the cargo feature of its source.

use conveyor_core::sources::{BrokerSpec, SourceSpec};
use std::time::Duration;

use crate::ingest::BrokerError;

/// Partitions of the topic [`prepare`] makes for a Kafka source.
pub const KAFKA_PARTITIONS: i32 = 3;

/// How long connecting to a broker may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a publisher waits without any confirmation arriving before giving up.
#[allow(dead_code)]
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(60);

/// A connection publishing to one source's broker (its stream, queue, subject or topic).
pub struct Publisher(Box<dyn BrokerPublisher>);

#[async_trait::async_trait]
/// One broker's way to publish and have every message confirmed.
trait BrokerPublisher: Send {
    async fn send(&mut self, bodies: &[Vec<u8>]) -> Result<(), BrokerError>;
    async fn close(self: Box<Self>) -> Result<(), BrokerError>;
}

impl Publisher {
    /// Connects to `spec`'s broker as a producer.
    pub async fn connect(spec: &SourceSpec) -> Result<Publisher, BrokerError> {
        let connecting = async {
            let sender: Result<Box<dyn BrokerPublisher>, BrokerError> = match &spec.broker {
                #[cfg(feature = "redis_stream")]
                BrokerSpec::RedisStream { .. } => {
                    Ok(Box::new(redis::Publisher::connect(spec).await?))
                }
                #[cfg(feature = "amqp")]
                BrokerSpec::Amqp { .. } => Ok(Box::new(amqp::Publisher::connect(spec).await?)),
                #[cfg(feature = "nats")]
                BrokerSpec::Nats { .. } => Ok(Box::new(nats::Publisher::connect(spec).await?)),
                #[cfg(feature = "mqtt")]
                BrokerSpec::Mqtt { .. } => Ok(Box::new(mqtt::Publisher::connect(spec).await?)),
                #[cfg(feature = "sqs")]
                BrokerSpec::Sqs { .. } => Ok(Box::new(sqs::Publisher::connect(spec).await?)),
                #[cfg(feature = "kafka")]
                BrokerSpec::Kafka { .. } => Ok(Box::new(kafka::Publisher::connect(spec).await?)),
                #[allow(unreachable_patterns)]
                other => Err(missing(other)),
            };
            sender
        };
        Ok(Publisher(within(connecting, "connect").await?))
    }

    /// Publishes each body as one message and returns once the broker has confirmed them all.
    pub async fn send(&mut self, bodies: &[Vec<u8>]) -> Result<(), BrokerError> {
        self.0.send(bodies).await
    }

    /// Closes the connection, after what was sent.
    pub async fn close(self) -> Result<(), BrokerError> {
        self.0.close().await
    }
}

/// Publishes `bodies` to `spec`'s broker on a connection of its own; returns once the broker
/// has confirmed every message.
pub async fn publish(spec: &SourceSpec, bodies: &[Vec<u8>]) -> Result<(), BrokerError> {
    let mut publisher = Publisher::connect(spec).await?;
    publisher.send(bodies).await?;
    publisher.close().await
}

/// Makes the stream, queue, session or topic `spec` reads, empty, and returns the source's
/// configuration as the broker named it (an SQS queue's URL is the one CreateQueue gave; the
/// queue's name is the last segment of the configured `queue_url`).
pub async fn prepare(spec: &SourceSpec) -> Result<SourceSpec, BrokerError> {
    let preparing = async {
        match &spec.broker {
            #[cfg(feature = "redis_stream")]
            BrokerSpec::RedisStream { .. } => redis::prepare(spec).await,
            #[cfg(feature = "amqp")]
            BrokerSpec::Amqp { .. } => amqp::prepare(spec).await,
            #[cfg(feature = "nats")]
            BrokerSpec::Nats { .. } => nats::prepare(spec).await,
            #[cfg(feature = "mqtt")]
            BrokerSpec::Mqtt { .. } => mqtt::prepare(spec).await,
            #[cfg(feature = "sqs")]
            BrokerSpec::Sqs { .. } => sqs::prepare(spec).await,
            #[cfg(feature = "kafka")]
            BrokerSpec::Kafka { .. } => kafka::prepare(spec).await,
            #[allow(unreachable_patterns)]
            other => Err(missing(other)),
        }
    };
    within(preparing, "prepare").await
}

/// Deletes what [`prepare`] made for `spec` (with what it holds, and the consumer groups,
/// consumers and sessions on it).
pub async fn remove(spec: &SourceSpec) -> Result<(), BrokerError> {
    let removing = async {
        match &spec.broker {
            #[cfg(feature = "redis_stream")]
            BrokerSpec::RedisStream { .. } => redis::remove(spec).await,
            #[cfg(feature = "amqp")]
            BrokerSpec::Amqp { .. } => amqp::remove(spec).await,
            #[cfg(feature = "nats")]
            BrokerSpec::Nats { .. } => nats::remove(spec).await,
            #[cfg(feature = "mqtt")]
            BrokerSpec::Mqtt { .. } => mqtt::remove(spec).await,
            #[cfg(feature = "sqs")]
            BrokerSpec::Sqs { .. } => sqs::remove(spec).await,
            #[cfg(feature = "kafka")]
            BrokerSpec::Kafka { .. } => kafka::remove(spec).await,
            #[allow(unreachable_patterns)]
            other => Err(missing(other)),
        }
    };
    within(removing, "remove").await
}

fn missing(broker: &BrokerSpec) -> BrokerError {
    BrokerError(format!(
        "this build has no {0} publisher (cargo feature {0})",
        broker.type_name()
    ))
}

/// `work`, failed if it takes longer than [`CONNECT_TIMEOUT`].
async fn within<T>(
    work: impl std::future::Future<Output = Result<T, BrokerError>>,
    what: &str,
) -> Result<T, BrokerError> {
    tokio::time::timeout(CONNECT_TIMEOUT, work)
        .await
        .map_err(|_| {
            BrokerError(format!(
                "{what}: the broker did not answer within {} s",
                CONNECT_TIMEOUT.as_secs()
            ))
        })?
}

/// The broker's URL from the configuration (required here, SQS's included).
#[allow(dead_code)]
fn url_of(spec: &SourceSpec) -> Result<String, BrokerError> {
    spec.broker
        .resolve_url()
        .map_err(BrokerError)?
        .ok_or_else(|| {
            BrokerError(format!(
                "{}: the source gives no url",
                spec.broker.type_name()
            ))
        })
}

#[cfg(feature = "redis_stream")]
mod redis {
    use super::*;
    use ::redis::aio::MultiplexedConnection;
    use conveyor_core::sources::Start;

    /// Entries per pipeline: one round trip each.
    const PIPELINE: usize = 1000;

    fn failed(what: &str) -> impl Fn(::redis::RedisError) -> BrokerError + '_ {
        move |error| BrokerError(format!("redis: {what}: {error}"))
    }

    async fn open(spec: &SourceSpec) -> Result<MultiplexedConnection, BrokerError> {
        let client = ::redis::Client::open(url_of(spec)?.as_str()).map_err(failed("open"))?;
        client
            .get_multiplexed_async_connection()
            .await
            .map_err(failed("connect"))
    }

    fn names(spec: &SourceSpec) -> Result<(&str, &str, &str), BrokerError> {
        match &spec.broker {
            BrokerSpec::RedisStream {
                stream,
                group,
                body_field,
                ..
            } => Ok((stream, group, body_field.as_deref().unwrap_or("body"))),
            _ => Err(BrokerError("not a redis_stream source".into())),
        }
    }

    pub(super) struct Publisher {
        connection: MultiplexedConnection,
        stream: String,
        field: String,
    }

    impl Publisher {
        pub(super) async fn connect(spec: &SourceSpec) -> Result<Self, BrokerError> {
            let (stream, _, field) = names(spec)?;
            Ok(Publisher {
                connection: open(spec).await?,
                stream: stream.to_string(),
                field: field.to_string(),
            })
        }
    }

    #[async_trait::async_trait]
    impl BrokerPublisher for Publisher {
        /// XADD with the body in the source's body field, pipelined.
        async fn send(&mut self, bodies: &[Vec<u8>]) -> Result<(), BrokerError> {
            for chunk in bodies.chunks(PIPELINE) {
                let mut pipe = ::redis::pipe();
                for body in chunk {
                    pipe.cmd("XADD")
                        .arg(&self.stream)
                        .arg("*")
                        .arg(&self.field)
                        .arg(body.as_slice())
                        .ignore();
                }
                tokio::time::timeout(
                    CONFIRM_TIMEOUT,
                    pipe.query_async::<()>(&mut self.connection),
                )
                .await
                .map_err(|_| BrokerError("redis: XADD: no answer".into()))?
                .map_err(failed("XADD"))?;
            }
            Ok(())
        }

        async fn close(self: Box<Self>) -> Result<(), BrokerError> {
            Ok(())
        }
    }

    /// The stream, emptied, with the source's consumer group (where the source would start
    /// it).
    pub(super) async fn prepare(spec: &SourceSpec) -> Result<SourceSpec, BrokerError> {
        let (stream, group, _) = names(spec)?;
        let mut connection = open(spec).await?;
        let from = match spec.start {
            Start::Earliest => "0",
            Start::Latest => "$",
        };
        ::redis::pipe()
            .atomic()
            .cmd("DEL")
            .arg(stream)
            .ignore()
            .cmd("XGROUP")
            .arg("CREATE")
            .arg(stream)
            .arg(group)
            .arg(from)
            .arg("MKSTREAM")
            .ignore()
            .query_async::<()>(&mut connection)
            .await
            .map_err(failed("create the stream"))?;
        Ok(spec.clone())
    }

    pub(super) async fn remove(spec: &SourceSpec) -> Result<(), BrokerError> {
        let (stream, _, _) = names(spec)?;
        let mut connection = open(spec).await?;
        ::redis::cmd("DEL")
            .arg(stream)
            .query_async::<()>(&mut connection)
            .await
            .map_err(failed("delete the stream"))
    }
}

#[cfg(feature = "amqp")]
mod amqp {
    use super::*;
    use lapin::options::{
        BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
    };
    use lapin::types::{AMQPValue, FieldTable};
    use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
    use lapin::{Confirmation, PublisherConfirm};
    use std::collections::VecDeque;

    /// Publishes sent and not yet confirmed, at most.
    const WINDOW: usize = 1000;

    /// How long a queue [`prepare`] made outlives its last use, should its run die before
    /// deleting it (ms).
    const EXPIRES_MS: i32 = 3_600_000;

    fn failed<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> BrokerError + '_ {
        move |error| BrokerError(format!("amqp: {what}: {error}"))
    }

    fn queue_of(spec: &SourceSpec) -> Result<&str, BrokerError> {
        match &spec.broker {
            BrokerSpec::Amqp { queue, .. } => Ok(queue),
            _ => Err(BrokerError("not an amqp source".into())),
        }
    }

    async fn open(spec: &SourceSpec) -> Result<(Connection, Channel), BrokerError> {
        let properties = ConnectionProperties::default()
            .with_connection_name(format!("conveyor publisher {}", spec.name).into());
        let connection = Connection::connect(&url_of(spec)?, properties)
            .await
            .map_err(failed("connect"))?;
        let channel = connection
            .create_channel()
            .await
            .map_err(failed("open a channel"))?;
        Ok((connection, channel))
    }

    pub(super) struct Publisher {
        connection: Connection,
        channel: Channel,
        queue: String,
    }

    impl Publisher {
        pub(super) async fn connect(spec: &SourceSpec) -> Result<Self, BrokerError> {
            let queue = queue_of(spec)?.to_string();
            let (connection, channel) = open(spec).await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(failed("turn publisher confirms on"))?;
            Ok(Publisher {
                connection,
                channel,
                queue,
            })
        }
    }

    async fn confirmed(confirm: PublisherConfirm) -> Result<(), BrokerError> {
        let confirmation = tokio::time::timeout(CONFIRM_TIMEOUT, confirm)
            .await
            .map_err(|_| BrokerError("amqp: the broker confirmed nothing for a minute".into()))?
            .map_err(failed("publish"))?;
        match confirmation {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(_)) => Err(BrokerError(
                "amqp: a message was returned unroutable (the queue is gone?)".into(),
            )),
            Confirmation::Nack(_) => Err(BrokerError("amqp: the broker refused a message".into())),
            Confirmation::NotRequested => Err(BrokerError(
                "amqp: the channel does not confirm publishes".into(),
            )),
        }
    }

    #[async_trait::async_trait]
    impl BrokerPublisher for Publisher {
        /// Persistent messages through the default exchange to the queue, mandatory (one the
        /// queue cannot take comes back), at most [`WINDOW`] unconfirmed at a time.
        async fn send(&mut self, bodies: &[Vec<u8>]) -> Result<(), BrokerError> {
            let mut pending: VecDeque<PublisherConfirm> = VecDeque::with_capacity(WINDOW);
            for body in bodies {
                if pending.len() >= WINDOW {
                    if let Some(oldest) = pending.pop_front() {
                        confirmed(oldest).await?;
                    }
                }
                let confirm = self
                    .channel
                    .basic_publish(
                        "".into(),
                        self.queue.as_str().into(),
                        BasicPublishOptions {
                            mandatory: true,
                            ..BasicPublishOptions::default()
                        },
                        body,
                        BasicProperties::default().with_delivery_mode(2),
                    )
                    .await
                    .map_err(failed("publish"))?;
                pending.push_back(confirm);
            }
            for confirm in pending {
                confirmed(confirm).await?;
            }
            Ok(())
        }

        async fn close(self: Box<Self>) -> Result<(), BrokerError> {
            self.connection
                .close(200, "done".into())
                .await
                .map_err(failed("close"))
        }
    }

    /// A durable queue (expiring an hour after its last use, should its run die first).
    pub(super) async fn prepare(spec: &SourceSpec) -> Result<SourceSpec, BrokerError> {
        let queue = queue_of(spec)?;
        let (connection, channel) = open(spec).await?;
        let mut arguments = FieldTable::default();
        arguments.insert("x-expires".into(), AMQPValue::LongInt(EXPIRES_MS));
        channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                arguments,
            )
            .await
            .map_err(failed("declare the queue"))?;
        let _ = connection.close(200, "done".into()).await;
        Ok(spec.clone())
    }

    pub(super) async fn remove(spec: &SourceSpec) -> Result<(), BrokerError> {
        let queue = queue_of(spec)?;
        let (connection, channel) = open(spec).await?;
        channel
            .queue_delete(queue.into(), QueueDeleteOptions::default())
            .await
            .map_err(failed("delete the queue"))?;
        let _ = connection.close(200, "done".into()).await;
        Ok(())
    }
}

#[cfg(feature = "nats")]
mod nats {
    use super::*;
    use async_nats::jetstream::{self, context::PublishAckFuture, stream};
    use std::collections::VecDeque;
    use std::future::IntoFuture;

    /// Publishes sent and not yet acknowledged by JetStream, at most (under the client's own
    /// limit, 5,000).
    const WINDOW: usize = 1000;

    fn failed<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> BrokerError + '_ {
        move |error| BrokerError(format!("nats: {what}: {error}"))
    }

    /// The stream, and the subject published to: the source's `subject` (which must then name
    /// one subject, no wildcard), else the stream's name.
    fn names(spec: &SourceSpec) -> Result<(&str, &str), BrokerError> {
        let BrokerSpec::Nats {
            stream, subject, ..
        } = &spec.broker
        else {
            return Err(BrokerError("not a nats source".into()));
        };
        let subject = subject.as_deref().unwrap_or(stream);
        if subject.split('.').any(|token| token == "*" || token == ">") {
            return Err(BrokerError(format!(
                "nats: the subject {subject:?} has a wildcard: a publisher needs one subject"
            )));
        }
        Ok((stream, subject))
    }

    async fn context(
        spec: &SourceSpec,
    ) -> Result<(async_nats::Client, jetstream::Context), BrokerError> {
        let client = async_nats::ConnectOptions::new()
            .name(format!("conveyor publisher {}", spec.name))
            .connection_timeout(Duration::from_secs(5))
            .connect(url_of(spec)?.as_str())
            .await
            .map_err(failed("connect"))?;
        let js = jetstream::new(client.clone());
        Ok((client, js))
    }

    pub(super) struct Publisher {
        client: async_nats::Client,
        js: jetstream::Context,
        subject: String,
    }

    impl Publisher {
        pub(super) async fn connect(spec: &SourceSpec) -> Result<Self, BrokerError> {
            let (_, subject) = names(spec)?;
            let subject = subject.to_string();
            let (client, js) = context(spec).await?;
            Ok(Publisher {
                client,
                js,
                subject,
            })
        }
    }

    async fn stored(ack: PublishAckFuture) -> Result<(), BrokerError> {
        tokio::time::timeout(CONFIRM_TIMEOUT, ack.into_future())
            .await
            .map_err(|_| BrokerError("nats: JetStream acknowledged nothing for a minute".into()))?
            .map(|_| ())
            .map_err(failed("publish"))
    }

    #[async_trait::async_trait]
    impl BrokerPublisher for Publisher {
        /// JetStream publishes, each acknowledged once the stream has stored it, at most
        /// [`WINDOW`] unacknowledged at a time.
        async fn send(&mut self, bodies: &[Vec<u8>]) -> Result<(), BrokerError> {
            let mut pending: VecDeque<PublishAckFuture> = VecDeque::with_capacity(WINDOW);
            for body in bodies {
                if pending.len() >= WINDOW {
                    if let Some(oldest) = pending.pop_front() {
                        stored(oldest).await?;
                    }
                }
                let ack = self
                    .js
                    .publish(self.subject.clone(), body.clone().into())
                    .await
                    .map_err(failed("publish"))?;
                pending.push_back(ack);
            }
            for ack in pending {
                stored(ack).await?;
            }
            Ok(())
        }

        async fn close(self: Box<Self>) -> Result<(), BrokerError> {
            self.client.flush().await.map_err(failed("flush"))
        }
    }

    /// A stream of the subject, with JetStream's defaults (file storage, limits retention).
    pub(super) async fn prepare(spec: &SourceSpec) -> Result<SourceSpec, BrokerError> {
        let (stream, subject) = names(spec)?;
        let (_client, js) = context(spec).await?;
        js.create_stream(stream::Config {
            name: stream.to_string(),
            subjects: vec![subject.to_string()],
            ..Default::default()
        })
        .await
        .map_err(failed("create the stream"))?;
        Ok(spec.clone())
    }

    /// Deletes the stream (and the source's durable consumer with it).
    pub(super) async fn remove(spec: &SourceSpec) -> Result<(), BrokerError> {
        let (stream, _) = names(spec)?;
        let (_client, js) = context(spec).await?;
        js.delete_stream(stream)
            .await
            .map(|_| ())
            .map_err(failed("delete the stream"))
    }
}

#[cfg(feature = "mqtt")]
mod mqtt {
    use super::*;
    use rumqttc::{
        AsyncClient, ConnectReturnCode, Event, EventLoop, MqttOptions, Outgoing, Packet, QoS,
    };
    use tokio::sync::watch;
    use tokio::task::JoinHandle;

    /// Requests queued for the event loop.
    const REQUESTS: usize = 1000;

    /// Host, port and credentials from `mqtt://[user[:password]@]host[:port]` (or `tcp://`);
    /// percent-escapes in the credentials are not decoded here.
    fn options(url: &str, client_id: String) -> Result<MqttOptions, BrokerError> {
        let bad = || {
            BrokerError(format!(
                "mqtt: {url:?} is not mqtt://[user[:password]@]host[:port]"
            ))
        };
        let rest = url
            .strip_prefix("mqtt://")
            .or_else(|| url.strip_prefix("tcp://"))
            .ok_or_else(bad)?;
        let authority = rest.split('/').next().unwrap_or_default();
        let (credentials, address) = match authority.rsplit_once('@') {
            Some((user_info, address)) => (Some(user_info), address),
            None => (None, authority),
        };
        let (host, port) = match address.rsplit_once(':') {
            Some((host, port)) => (host, port.parse::<u16>().map_err(|_| bad())?),
            None => (address, 1883),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(bad());
        }
        let mut options = MqttOptions::new(client_id, host, port);
        options
            .set_keep_alive(Duration::from_secs(30))
            .set_max_packet_size(1 << 20, 1 << 20);
        if let Some(user_info) = credentials {
            let (user, password) = user_info.split_once(':').unwrap_or((user_info, ""));
            options.set_credentials(user, password);
        }
        Ok(options)
    }

    fn names(spec: &SourceSpec) -> Result<(&str, &str), BrokerError> {
        match &spec.broker {
            BrokerSpec::Mqtt {
                topic, client_id, ..
            } => Ok((topic, client_id)),
            _ => Err(BrokerError("not an mqtt source".into())),
        }
    }

    fn failed<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> BrokerError + '_ {
        move |error| BrokerError(format!("mqtt: {what}: {error}"))
    }

    /// Polls until the broker's CONNACK (an error if it refuses), then until `done` says the
    /// packet waited for came.
    async fn drive(
        event_loop: &mut EventLoop,
        mut done: impl FnMut(&Event) -> bool,
    ) -> Result<(), BrokerError> {
        loop {
            let event = event_loop.poll().await.map_err(failed("connection"))?;
            if let Event::Incoming(Packet::ConnAck(ack)) = &event {
                if ack.code != ConnectReturnCode::Success {
                    return Err(BrokerError(format!(
                        "mqtt: the broker refused the connection: {:?}",
                        ack.code
                    )));
                }
            }
            if done(&event) {
                return Ok(());
            }
        }
    }

    /// Connects as `client_id` (`clean`: a clean session, which ends the one kept under that
    /// id), subscribes to `subscribe` at QoS 1 if given, and disconnects once the broker has
    /// answered.
    async fn session(
        spec: &SourceSpec,
        client_id: &str,
        clean: bool,
        subscribe: Option<&str>,
    ) -> Result<(), BrokerError> {
        let mut options = options(&url_of(spec)?, client_id.to_string())?;
        options.set_clean_session(clean);
        let (client, mut event_loop) = AsyncClient::new(options, 10);
        match subscribe {
            Some(topic) => {
                client
                    .subscribe(topic, QoS::AtLeastOnce)
                    .await
                    .map_err(failed("subscribe"))?;
                drive(&mut event_loop, |event| {
                    matches!(event, Event::Incoming(Packet::SubAck(_)))
                })
                .await?;
            }
            None => {
                drive(&mut event_loop, |event| {
                    matches!(event, Event::Incoming(Packet::ConnAck(_)))
                })
                .await?
            }
        }
        client.disconnect().await.map_err(failed("disconnect"))?;
        // Sends the DISCONNECT; the broker then closes the connection.
        let _ = drive(&mut event_loop, |event| {
            matches!(event, Event::Outgoing(Outgoing::Disconnect))
        })
        .await;
        Ok(())
    }

    pub(super) struct Publisher {
        client: AsyncClient,
        topic: String,
        sent: u64,
        /// PUBACKs received, or the error that ended the connection.
        acked: watch::Receiver<Result<u64, String>>,
        event_loop: JoinHandle<()>,
    }

    impl Publisher {
        pub(super) async fn connect(spec: &SourceSpec) -> Result<Self, BrokerError> {
            let (topic, client_id) = names(spec)?;
            let options = options(&url_of(spec)?, format!("{client_id}-publisher"))?;
            let (client, mut event_loop) = AsyncClient::new(options, REQUESTS);
            drive(&mut event_loop, |event| {
                matches!(event, Event::Incoming(Packet::ConnAck(_)))
            })
            .await?;
            let (count, acked) = watch::channel(Ok(0));
            let event_loop = tokio::spawn(async move {
                loop {
                    match event_loop.poll().await {
                        Ok(Event::Incoming(Packet::PubAck(_))) => {
                            count.send_modify(|n| {
                                if let Ok(n) = n {
                                    *n += 1;
                                }
                            });
                        }
                        Ok(Event::Outgoing(Outgoing::Disconnect)) => return,
                        Ok(_) => {}
                        Err(error) => {
                            let _ = count.send(Err(error.to_string()));
                            return;
                        }
                    }
                }
            });
            Ok(Publisher {
                client,
                topic: topic.to_string(),
                sent: 0,
                acked,
                event_loop,
            })
        }
    }

    #[async_trait::async_trait]
    impl BrokerPublisher for Publisher {
        /// QoS 1 publishes (the client keeps its in-flight window), then waits for every
        /// PUBACK.
        async fn send(&mut self, bodies: &[Vec<u8>]) -> Result<(), BrokerError> {
            for body in bodies {
                if let Err(error) = &*self.acked.borrow() {
                    return Err(BrokerError(format!("mqtt: publish: {error}")));
                }
                self.client
                    .publish(self.topic.as_str(), QoS::AtLeastOnce, false, body.clone())
                    .await
                    .map_err(failed("publish"))?;
                self.sent += 1;
            }
            let sent = self.sent;
            let waited = tokio::time::timeout(
                CONFIRM_TIMEOUT,
                self.acked
                    .wait_for(|acked| acked.as_ref().map_or(true, |n| *n >= sent)),
            )
            .await
            .map_err(|_| BrokerError("mqtt: the broker confirmed nothing for a minute".into()))?
            .map_err(|_| BrokerError("mqtt: the connection ended".into()))?;
            match &*waited {
                Ok(_) => Ok(()),
                Err(error) => Err(BrokerError(format!("mqtt: publish: {error}"))),
            }
        }

        async fn close(self: Box<Self>) -> Result<(), BrokerError> {
            let disconnected = self.client.disconnect().await;
            let abort = self.event_loop.abort_handle();
            if tokio::time::timeout(Duration::from_secs(2), self.event_loop)
                .await
                .is_err()
            {
                abort.abort();
            }
            disconnected.map_err(failed("disconnect"))
        }
    }

    /// The source's persistent session, subscribed to its topic at QoS 1: the broker keeps
    /// what is published to the topic for the source from now on (up to its own limit per
    /// session: Mosquitto's `max_queued_messages`, 1,000 by default, beyond those in flight).
    pub(super) async fn prepare(spec: &SourceSpec) -> Result<SourceSpec, BrokerError> {
        let (topic, client_id) = names(spec)?;
        session(spec, client_id, false, Some(topic)).await?;
        Ok(spec.clone())
    }

    /// Ends the source's session (a clean connection under its client id).
    pub(super) async fn remove(spec: &SourceSpec) -> Result<(), BrokerError> {
        let (_, client_id) = names(spec)?;
        session(spec, client_id, true, None).await
    }
}

#[cfg(feature = "sqs")]
mod sqs {
    use super::*;
    use aws_sdk_sqs::config::{Credentials, Region};
    use aws_sdk_sqs::error::DisplayErrorContext;
    use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
    use aws_sdk_sqs::Client;

    /// SQS's limit on entries per SendMessageBatch.
    const SQS_BATCH: usize = 10;

    /// SendMessageBatch calls in flight at once.
    const LANES: usize = 8;

    fn failed<E: std::error::Error>(what: &str) -> impl Fn(E) -> BrokerError + '_ {
        move |error| BrokerError(format!("sqs: {what}: {}", DisplayErrorContext(&error)))
    }

    /// A client as the source makes one: its endpoint, region and credentials (the variables
    /// it names, else the SDK's own chain).
    async fn client(spec: &SourceSpec) -> Result<(Client, String), BrokerError> {
        let BrokerSpec::Sqs {
            queue_url,
            region,
            access_key_id_env,
            secret_access_key_env,
            ..
        } = &spec.broker
        else {
            return Err(BrokerError("not an sqs source".into()));
        };
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(Region::new(region.clone()))
            .timeout_config(
                aws_config::timeout::TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .operation_timeout(CONFIRM_TIMEOUT)
                    .build(),
            );
        if let Some(endpoint) = spec.broker.resolve_url().map_err(BrokerError)? {
            loader = loader.endpoint_url(endpoint);
        }
        if let (Some(id), Some(secret)) = (access_key_id_env, secret_access_key_env) {
            let read = |name: &String| {
                std::env::var(name).map_err(|_| {
                    BrokerError(format!("sqs: the environment variable {name} is not set"))
                })
            };
            loader = loader.credentials_provider(Credentials::new(
                read(id)?,
                read(secret)?,
                None,
                None,
                "conveyor",
            ));
        }
        Ok((Client::new(&loader.load().await), queue_url.clone()))
    }

    pub(super) struct Publisher {
        client: Client,
        queue_url: String,
    }

    impl Publisher {
        pub(super) async fn connect(spec: &SourceSpec) -> Result<Self, BrokerError> {
            let (client, queue_url) = client(spec).await?;
            Ok(Publisher { client, queue_url })
        }
    }

    async fn send_batches(
        client: Client,
        queue_url: String,
        batches: Vec<Vec<SendMessageBatchRequestEntry>>,
    ) -> Result<(), BrokerError> {
        for entries in batches {
            let output = client
                .send_message_batch()
                .queue_url(&queue_url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(failed("SendMessageBatch"))?;
            if let Some(failure) = output.failed().first() {
                return Err(BrokerError(format!(
                    "sqs: SendMessageBatch: {} ({})",
                    failure.code(),
                    failure.message().unwrap_or("no message")
                )));
            }
        }
        Ok(())
    }

    #[async_trait::async_trait]
    impl BrokerPublisher for Publisher {
        /// SendMessageBatch, ten messages a call, [`LANES`] calls at a time.
        async fn send(&mut self, bodies: &[Vec<u8>]) -> Result<(), BrokerError> {
            let mut lanes: Vec<Vec<Vec<SendMessageBatchRequestEntry>>> =
                (0..LANES).map(|_| Vec::new()).collect();
            for (index, chunk) in bodies.chunks(SQS_BATCH).enumerate() {
                let entries = chunk
                    .iter()
                    .enumerate()
                    .map(|(id, body)| {
                        SendMessageBatchRequestEntry::builder()
                            .id(id.to_string())
                            .message_body(String::from_utf8_lossy(body))
                            .build()
                            .map_err(failed("build an entry"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                lanes[index % LANES].push(entries);
            }
            let mut tasks = tokio::task::JoinSet::new();
            for lane in lanes.into_iter().filter(|lane| !lane.is_empty()) {
                tasks.spawn(send_batches(
                    self.client.clone(),
                    self.queue_url.clone(),
                    lane,
                ));
            }
            while let Some(done) = tasks.join_next().await {
                done.map_err(|error| BrokerError(format!("sqs: a sending task: {error}")))??;
            }
            Ok(())
        }

        async fn close(self: Box<Self>) -> Result<(), BrokerError> {
            Ok(())
        }
    }

    /// CreateQueue, named by the last segment of the source's `queue_url`; the source's
    /// `queue_url` becomes the one SQS gave.
    pub(super) async fn prepare(spec: &SourceSpec) -> Result<SourceSpec, BrokerError> {
        let (client, queue_url) = client(spec).await?;
        let name = queue_url
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .filter(|name| !name.is_empty())
            .ok_or_else(|| BrokerError(format!("sqs: no queue name in {queue_url:?}")))?;
        let made = client
            .create_queue()
            .queue_name(name)
            .send()
            .await
            .map_err(failed("CreateQueue"))?;
        let made = made
            .queue_url()
            .ok_or_else(|| BrokerError("sqs: CreateQueue gave no queue url".into()))?;
        let mut spec = spec.clone();
        if let BrokerSpec::Sqs { queue_url, .. } = &mut spec.broker {
            *queue_url = made.to_string();
        }
        Ok(spec)
    }

    pub(super) async fn remove(spec: &SourceSpec) -> Result<(), BrokerError> {
        let (client, queue_url) = client(spec).await?;
        client
            .delete_queue()
            .queue_url(queue_url)
            .send()
            .await
            .map(|_| ())
            .map_err(failed("DeleteQueue"))
    }
}

#[cfg(feature = "kafka")]
mod kafka {
    use super::*;
    use krafka::admin::NewTopic;
    use krafka::error::KrafkaError;
    use krafka::producer::Producer;
    use krafka::{Kafka, Record};

    fn failed(what: &str) -> impl Fn(KrafkaError) -> BrokerError + '_ {
        move |error| BrokerError(format!("kafka: {what}: {error}"))
    }

    fn topic_of(spec: &SourceSpec) -> Result<&str, BrokerError> {
        match &spec.broker {
            BrokerSpec::Kafka { topic, .. } => Ok(topic),
            _ => Err(BrokerError("not a kafka source".into())),
        }
    }

    async fn open(spec: &SourceSpec) -> Result<Kafka, BrokerError> {
        Kafka::builder(url_of(spec)?)
            .client_id(format!("conveyor-publisher-{}", spec.name))
            .connect()
            .await
            .map_err(failed("connect"))
    }

    pub(super) struct Publisher {
        producer: Producer,
        topic: String,
        sent: u64,
    }

    impl Publisher {
        pub(super) async fn connect(spec: &SourceSpec) -> Result<Self, BrokerError> {
            let topic = topic_of(spec)?.to_string();
            let producer = open(spec)
                .await?
                .producer()
                .build()
                .await
                .map_err(failed("make a producer"))?;
            Ok(Publisher {
                producer,
                topic,
                sent: 0,
            })
        }
    }

    #[async_trait::async_trait]
    impl BrokerPublisher for Publisher {
        /// Records keyed by their number (so they spread over the partitions), produced with
        /// the client's batching, each waited for until the brokers acknowledged it.
        async fn send(&mut self, bodies: &[Vec<u8>]) -> Result<(), BrokerError> {
            let mut deliveries = Vec::with_capacity(bodies.len());
            for body in bodies {
                let record =
                    Record::new(self.topic.clone(), body.clone()).key(self.sent.to_string());
                self.sent += 1;
                deliveries.push(
                    self.producer
                        .enqueue(record)
                        .await
                        .map_err(failed("produce"))?,
                );
            }
            for delivery in deliveries {
                let stored = tokio::time::timeout(CONFIRM_TIMEOUT, delivery)
                    .await
                    .map_err(|_| {
                        BrokerError("kafka: the brokers acknowledged nothing for a minute".into())
                    })?
                    .map_err(failed("produce"))?;
                if stored.offset < 0 {
                    return Err(BrokerError(
                        "kafka: a record was acknowledged without an offset".into(),
                    ));
                }
            }
            Ok(())
        }

        async fn close(self: Box<Self>) -> Result<(), BrokerError> {
            self.producer.close().await.map_err(failed("close"))
        }
    }

    /// A topic of [`KAFKA_PARTITIONS`] partitions, replication factor 1.
    pub(super) async fn prepare(spec: &SourceSpec) -> Result<SourceSpec, BrokerError> {
        let topic = topic_of(spec)?;
        let kafka = open(spec).await?;
        let new = NewTopic::new(topic, KAFKA_PARTITIONS, 1).map_err(failed("a topic"))?;
        let created = kafka
            .admin()
            .create_topics([new], Default::default())
            .await
            .map_err(failed("create the topic"))?;
        for (_, result) in created {
            result.map_err(failed("create the topic"))?;
        }
        Ok(spec.clone())
    }

    pub(super) async fn remove(spec: &SourceSpec) -> Result<(), BrokerError> {
        let topic = topic_of(spec)?;
        let kafka = open(spec).await?;
        let deleted = kafka
            .admin()
            .delete_topics([topic], Default::default())
            .await
            .map_err(failed("delete the topic"))?;
        for (_, result) in deleted {
            result.map_err(failed("delete the topic"))?;
        }
        Ok(())
    }
}
