//! A Redis stream read by a consumer group: XREADGROUP for new entries, XACK once their jobs
//! are durable, and XAUTOCLAIM for entries another consumer took and never acknowledged (its
//! server was killed) once they have waited `claim_idle_ms`.

use conveyor_core::sources::{BrokerSpec, Message, SourceSpec, Start};
use redis::aio::MultiplexedConnection;
use redis::streams::{
    StreamAutoClaimOptions, StreamAutoClaimReply, StreamId, StreamReadOptions, StreamReadReply,
};
use redis::AsyncCommands;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::ingest::{Broker, BrokerError};

const DEFAULT_CLAIM_IDLE: Duration = Duration::from_secs(60);
/// How long a read waits on the server for new entries before answering empty.
const READ_BLOCK: Duration = Duration::from_secs(1);
/// How much longer than the block the client waits for any answer before calling it lost.
const ANSWER_MARGIN: Duration = Duration::from_secs(4);

pub(crate) struct RedisStream {
    connection: MultiplexedConnection,
    stream: String,
    group: String,
    consumer: String,
    body_field: String,
    claim_idle: Duration,
    last_claim: Option<Instant>,
}

fn failed(what: &str) -> impl Fn(redis::RedisError) -> BrokerError + '_ {
    move |error| BrokerError(format!("redis: {what}: {error}"))
}

/// Connects and makes the consumer group if it is missing (at the stream's start, or its end
/// for `start: latest`).
pub(crate) async fn connect(spec: &SourceSpec) -> Result<RedisStream, BrokerError> {
    let BrokerSpec::RedisStream {
        stream,
        group,
        consumer,
        body_field,
        claim_idle_ms,
        ..
    } = &spec.broker
    else {
        return Err(BrokerError("not a redis_stream source".into()));
    };
    let url = spec
        .broker
        .resolve_url()
        .map_err(BrokerError)?
        .ok_or_else(|| BrokerError("no url".into()))?;
    let client = redis::Client::open(url.as_str()).map_err(failed("open"))?;
    // The client's default answer timeout (500 ms) is shorter than the read's BLOCK: an idle
    // stream would read as a failure. Every answer may take the block plus a margin.
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(READ_BLOCK + ANSWER_MARGIN));
    let mut connection = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(failed("connect"))?;
    let from = match spec.start {
        Start::Earliest => "0",
        Start::Latest => "$",
    };
    let made: redis::RedisResult<()> = connection.xgroup_create_mkstream(stream, group, from).await;
    if let Err(error) = made {
        // BUSYGROUP: the group is there already, which is what a restart expects.
        if error.code() != Some("BUSYGROUP") {
            return Err(failed("create the consumer group")(error));
        }
    }
    Ok(RedisStream {
        connection,
        stream: stream.clone(),
        group: group.clone(),
        consumer: consumer
            .clone()
            .unwrap_or_else(crate::ingest::default_consumer),
        body_field: body_field.clone().unwrap_or_else(|| "body".into()),
        claim_idle: claim_idle_ms.map_or(DEFAULT_CLAIM_IDLE, Duration::from_millis),
        last_claim: None,
    })
}

impl RedisStream {
    fn message(&self, entry: StreamId) -> Message {
        let mut headers = BTreeMap::new();
        let mut body = Vec::new();
        for (field, value) in entry.map {
            let bytes: Vec<u8> = redis::from_redis_value(value).unwrap_or_default();
            if field == self.body_field {
                body = bytes;
            } else {
                headers.insert(field, String::from_utf8_lossy(&bytes).into_owned());
            }
        }
        // An entry id is `<milliseconds>-<sequence>`: the time Redis added it.
        let sent_at = entry
            .id
            .split_once('-')
            .and_then(|(millis, _)| millis.parse::<i64>().ok())
            .and_then(chrono::DateTime::from_timestamp_millis);
        Message {
            identity: entry.id,
            sent_at,
            headers,
            subject: Some(self.stream.clone()),
            body,
        }
    }

    /// Entries other consumers have held unacknowledged for `claim_idle`, taken over (at most
    /// once per half of that time).
    async fn claim_abandoned(&mut self, max: usize) -> Result<Vec<Message>, BrokerError> {
        if self
            .last_claim
            .is_some_and(|at| at.elapsed() < self.claim_idle / 2)
        {
            return Ok(Vec::new());
        }
        self.last_claim = Some(Instant::now());
        let idle = u64::try_from(self.claim_idle.as_millis()).unwrap_or(u64::MAX);
        let reply: StreamAutoClaimReply = self
            .connection
            .xautoclaim_options(
                &self.stream,
                &self.group,
                &self.consumer,
                idle,
                "0-0",
                StreamAutoClaimOptions::default().count(max),
            )
            .await
            .map_err(failed("claim abandoned entries"))?;
        Ok(reply
            .claimed
            .into_iter()
            .map(|entry| self.message(entry))
            .collect())
    }
}

#[async_trait::async_trait]
impl Broker for RedisStream {
    async fn receive(&mut self, max: usize) -> Result<Vec<Message>, BrokerError> {
        let claimed = self.claim_abandoned(max).await?;
        if !claimed.is_empty() {
            return Ok(claimed);
        }
        let options = StreamReadOptions::default()
            .group(&self.group, &self.consumer)
            .count(max)
            .block(usize::try_from(READ_BLOCK.as_millis()).unwrap_or(1000));
        let reply: StreamReadReply = self
            .connection
            .xread_options(&[&self.stream], &[">"], &options)
            .await
            .map_err(failed("read"))?;
        Ok(reply
            .keys
            .into_iter()
            .flat_map(|key| key.ids)
            .map(|entry| self.message(entry))
            .collect())
    }

    async fn ack(&mut self, identities: &[String]) -> Result<(), BrokerError> {
        for chunk in identities.chunks(1000) {
            let _: i64 = self
                .connection
                .xack(&self.stream, &self.group, chunk)
                .await
                .map_err(failed("acknowledge"))?;
        }
        Ok(())
    }

    /// The group's `lag` from XINFO GROUPS (Redis 7: entries not yet delivered to it).
    async fn lag(&mut self) -> Result<Option<u64>, BrokerError> {
        let reply: redis::streams::StreamInfoGroupsReply = self
            .connection
            .xinfo_groups(&self.stream)
            .await
            .map_err(failed("read the group's lag"))?;
        Ok(reply
            .groups
            .into_iter()
            .find(|group| group.name == self.group)
            .and_then(|group| group.lag)
            .and_then(|lag| u64::try_from(lag).ok()))
    }
}
