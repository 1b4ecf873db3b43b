//! Schedules: named cron expressions, evaluated in an IANA time zone, or fixed intervals
//! (`every: "30s"`), that enqueue a job template on every tick.
//!
//! This module is pure: it parses and validates schedules ([`Schedule::from_spec`]), plans which
//! ticks are due at a given instant ([`Schedule::plan`]) and builds each run's job
//! ([`Schedule::job_for`]). The stores keep schedules and their runs and fire ticks atomically
//! ([`crate::ScheduleStore::schedule_fire`]); the worker crate's scheduler drives the two.
//!
//! Cron expressions are parsed by `croner` (5 fields, or 6 with seconds first; `@daily`-style
//! nicknames), time zones come from `chrono-tz`. Daylight-saving transitions follow croner's
//! rules (those of the Open Cron Pattern Specification):
//! - a *fixed-time* expression (one second, one minute and one hour, e.g. `30 2 * * *`) whose
//!   time falls into a spring-forward gap runs once, at the first instant after the gap; in a
//!   fall-back overlap it runs once, at the earlier of the two instants;
//! - an *interval* expression (a wildcard, range, list or step in those fields, e.g.
//!   `*/15 * * * *`) skips the wall-clock times a gap removes and runs at both instants of a
//!   repeated time, so it keeps its real-time rhythm.
//!
//! Either way no tick is planned twice: ticks are instants, and a schedule fires only ticks
//! after the last one it handled.
//!
//! An *interval* schedule (`every`, see [`parse_every`]) ticks at `anchor + k * every`
//! (k = 1, 2, ...), where the anchor is the instant it was created or its interval last
//! changed, in whole seconds. Time zones do not apply to intervals: a schedule with `every`
//! must leave `timezone` at its default, `UTC`. Stores need not keep the anchor: a schedule's
//! `due_after` is always the anchor or one of its ticks, so the ticks after it are
//! `due_after + k * every`.
//!
//! One cohesive thing, kept whole on purpose (~1,000 lines): specs, the tick arithmetic and the
//! missed-tick policies share one notion of an anchor and its ticks.

use chrono::{DateTime, SecondsFormat, Timelike, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::str::FromStr;
use std::time::Duration;
use uuid::Uuid;

use crate::client::TypedJob;
use crate::error::ValidationError;
use crate::job::{JobState, NewJob, DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE};
use crate::validate;

/// The time zone of a schedule that names none.
pub const DEFAULT_TIMEZONE: &str = "UTC";
/// How many missed ticks `missed: catch_up` runs when `max_catch_up` is not given.
pub const DEFAULT_MAX_CATCH_UP: u32 = 10;
/// The largest `max_catch_up`: one firing stays a bounded transaction.
pub const MAX_CATCH_UP_LIMIT: u32 = 1000;
/// Schedule names are job names (`[A-Za-z0-9_.:-]`) of at most this length, so that the tag
/// `schedule:{name}` each run's job carries is itself a valid tag.
pub const MAX_SCHEDULE_NAME_LEN: usize = validate::MAX_NAME_LEN - SCHEDULE_TAG_PREFIX.len();
/// The shortest interval `every` accepts.
pub const MIN_EVERY: Duration = Duration::from_secs(1);
/// The longest interval `every` accepts: 366 days.
pub const MAX_EVERY: Duration = Duration::from_secs(366 * 86_400);
/// How late a tick may be fired and still count as on time (see [`Schedule::plan`]).
pub const DEFAULT_MISFIRE_THRESHOLD: Duration = Duration::from_secs(5);
/// Runs kept per schedule; older ones are pruned when new ones are recorded.
pub const RUNS_KEPT: usize = 1000;
/// Runs included in a schedule's view ([`ScheduleView::recent_runs`]).
pub const RECENT_RUNS: usize = 10;

/// Prefix of the tag (and of the idempotency key) every run's job carries.
const SCHEDULE_TAG_PREFIX: &str = "schedule:";
/// Most on-time ticks one plan returns: a bound for absurd thresholds on per-second schedules.
const MAX_ON_TIME: usize = 1000;
/// Dropped ticks are counted up to this many (the count says "at least").
const DROPPED_COUNT_CAP: u64 = 1000;

/// What a tick does while the schedule's previous run is unfinished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OverlapPolicy {
    /// Record a skipped run instead of enqueuing (the default): at most one run at a time.
    #[default]
    Skip,
    /// Enqueue regardless: runs may overlap.
    Allow,
}

/// The `missed` field as written: which policy, without its maximum (`max_catch_up`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MissedKind {
    #[default]
    Skip,
    CatchUp,
}

/// What happens to ticks missed while no scheduler ran (downtime, a leader failover): ticks
/// older than the misfire threshold when they are planned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MissedPolicy {
    /// Missed ticks are dropped (the default).
    #[default]
    Skip,
    /// The `max` most recent missed ticks run, oldest first; older ones are dropped.
    CatchUp { max: u32 },
}

/// The job each run enqueues. Unset fields take the defaults of [`NewJob::new`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobTemplate {
    pub kind: String,
    #[serde(default)]
    pub payload: Value,
    #[serde(default = "default_queue")]
    pub queue: String,
    #[serde(default, deserialize_with = "crate::wire::int")]
    pub priority: i32,
    #[serde(
        default = "default_max_attempts",
        deserialize_with = "crate::wire::int"
    )]
    pub max_attempts: u32,
    /// `null` (as schedule views show it) is the same as leaving it out.
    #[serde(default, deserialize_with = "crate::wire::nullable_int")]
    pub timeout_ms: Option<u64>,
    /// Each run's job carries these and `schedule:{name}`.
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub tenant: Option<String>,
}

fn default_queue() -> String {
    DEFAULT_QUEUE.to_string()
}

fn default_max_attempts() -> u32 {
    DEFAULT_MAX_ATTEMPTS
}

/// A string that is given must say something: an empty `cron` is refused rather than taken
/// for a left-out one.
fn non_blank<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    let text = String::deserialize(deserializer)?;
    if text.trim().is_empty() {
        return Err(serde::de::Error::invalid_value(
            serde::de::Unexpected::Str(&text),
            &"a cron expression (leave cron out to use every)",
        ));
    }
    Ok(text)
}

fn default_timezone() -> String {
    DEFAULT_TIMEZONE.to_string()
}

impl JobTemplate {
    pub fn new(kind: impl Into<String>, payload: Value) -> Self {
        Self {
            kind: kind.into(),
            payload,
            queue: default_queue(),
            priority: 0,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            timeout_ms: None,
            tags: Vec::new(),
            tenant: None,
        }
    }

    /// A template enqueuing `job` (its kind and its value as the payload).
    pub fn typed<T: TypedJob>(job: &T) -> Result<Self, ValidationError> {
        let payload = serde_json::to_value(job).map_err(|e| {
            ValidationError::new("job.payload", format!("cannot serialize the job: {e}"))
        })?;
        Ok(Self::new(T::KIND, payload))
    }

    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = queue.into();
        self
    }
}

/// A schedule as written in an HTTP body or the schedules file (everything but its name).
/// [`Schedule::from_spec`] validates it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleSpec {
    /// 5 fields (minute hour day-of-month month day-of-week), or 6 with seconds first. Exactly
    /// one of `cron` and `every` is given. Left out, it is empty here (and an interval
    /// schedule's JSON leaves it out); given, it must not be blank.
    #[serde(
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "non_blank"
    )]
    pub cron: String,
    /// A fixed interval such as `30s`, `5m`, `1h30m` or `2d` (see [`parse_every`]), instead of
    /// `cron`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<String>,
    /// An IANA time zone name such as `Europe/Berlin` (default `UTC`). Only for `cron`: with
    /// `every` it must stay `UTC`.
    #[serde(default = "default_timezone")]
    pub timezone: String,
    pub job: JobTemplate,
    #[serde(default)]
    pub overlap: OverlapPolicy,
    #[serde(default)]
    pub missed: MissedKind,
    /// With `missed: catch_up`: most missed ticks run after downtime (default 10).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::wire::opt_int"
    )]
    pub max_catch_up: Option<u32>,
    /// While true the schedule fires nothing: its ticks pass as skipped, and when resumed it
    /// goes on from the next tick (the missed-run policy does not replay a pause).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

impl ScheduleSpec {
    /// A schedule in UTC that skips overlapping and missed runs.
    pub fn new(cron: impl Into<String>, job: JobTemplate) -> Self {
        Self {
            cron: cron.into(),
            every: None,
            timezone: default_timezone(),
            job,
            overlap: OverlapPolicy::Skip,
            missed: MissedKind::Skip,
            max_catch_up: None,
            paused: false,
        }
    }

    /// Paused (fires nothing) or not.
    pub fn paused(mut self, paused: bool) -> Self {
        self.paused = paused;
        self
    }

    /// A schedule running every `every` (such as `"30s"`, `"1h30m"`) that skips overlapping
    /// and missed runs.
    pub fn every(every: impl Into<String>, job: JobTemplate) -> Self {
        Self {
            every: Some(every.into()),
            ..Self::new(String::new(), job)
        }
    }

    pub fn timezone(mut self, timezone: impl Into<String>) -> Self {
        self.timezone = timezone.into();
        self
    }

    pub fn overlap(mut self, overlap: OverlapPolicy) -> Self {
        self.overlap = overlap;
        self
    }

    pub fn missed(mut self, missed: MissedPolicy) -> Self {
        match missed {
            MissedPolicy::Skip => {
                self.missed = MissedKind::Skip;
                self.max_catch_up = None;
            }
            MissedPolicy::CatchUp { max } => {
                self.missed = MissedKind::CatchUp;
                self.max_catch_up = Some(max);
            }
        }
        self
    }
}

/// How a schedule's ticks are computed.
#[derive(Debug, Clone)]
enum Ticks {
    /// A cron expression in a time zone.
    Cron { cron: Box<Cron>, tz: Tz },
    /// Every this many seconds from the anchor.
    Every { seconds: i64 },
}

/// Parses an interval such as `30s`, `5m`, `1h30m` or `2d`: one or more whole numbers, each
/// followed by its unit (`s`, `m`, `h`, `d` or `w`), at least [`MIN_EVERY`] and at most
/// [`MAX_EVERY`] in all. Errors name the field `every`.
///
/// ```
/// use conveyor_core::schedule::parse_every;
/// use std::time::Duration;
/// assert_eq!(parse_every("1h30m").unwrap(), Duration::from_secs(5400));
/// assert_eq!(parse_every("30").unwrap_err().field, "every");
/// ```
pub fn parse_every(text: &str) -> Result<Duration, ValidationError> {
    let bad = |why: &str| {
        ValidationError::new(
            "every",
            format!(
                "{text:?} is not a valid interval ({why}); expected whole numbers with units, \
                 such as 30s, 5m, 1h30m or 2d (units s, m, h, d, w)"
            ),
        )
    };
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(bad("it is empty"));
    }
    let mut total: u64 = 0;
    let mut rest = trimmed;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return Err(bad("a number must come before each unit"));
        }
        let (number, after) = rest.split_at(digits);
        let number: u64 = number.parse().map_err(|_| bad("a number is too large"))?;
        let mut chars = after.chars();
        let unit = match chars.next() {
            Some('s') => 1,
            Some('m') => 60,
            Some('h') => 3_600,
            Some('d') => 86_400,
            Some('w') => 7 * 86_400,
            Some(_) => return Err(bad("unknown unit")),
            None => return Err(bad("the last number has no unit")),
        };
        total = number
            .checked_mul(unit)
            .and_then(|part| total.checked_add(part))
            .ok_or_else(|| bad("too long"))?;
        rest = chars.as_str();
    }
    let every = Duration::from_secs(total);
    if every < MIN_EVERY {
        return Err(bad("it must be at least 1s"));
    }
    if every > MAX_EVERY {
        return Err(bad("it must be at most 366d"));
    }
    Ok(every)
}

/// A validated schedule: its cron expression parsed and its time zone resolved, or its
/// interval parsed.
///
/// ```
/// use conveyor_core::schedule::{JobTemplate, MissedPolicy, Schedule, ScheduleSpec};
/// let spec = ScheduleSpec::new("0 3 * * *", JobTemplate::new("nightly_report", serde_json::json!({})))
///     .timezone("Europe/Berlin")
///     .missed(MissedPolicy::CatchUp { max: 3 });
/// let schedule = Schedule::from_spec("nightly-report", spec).unwrap();
/// assert_eq!(schedule.timezone(), "Europe/Berlin");
/// ```
#[derive(Debug, Clone)]
pub struct Schedule {
    name: String,
    spec: ScheduleSpec,
    ticks: Ticks,
    missed: MissedPolicy,
}

impl PartialEq for Schedule {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.spec == other.spec
    }
}

/// How a schedule serializes: its name, then its spec's fields.
#[derive(Serialize)]
struct NamedSpec<'a> {
    name: &'a str,
    #[serde(flatten)]
    spec: &'a ScheduleSpec,
}

impl Serialize for Schedule {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        NamedSpec {
            name: &self.name,
            spec: &self.spec,
        }
        .serialize(serializer)
    }
}

/// The parser every schedule uses: 5 or 6 fields (seconds optional, years not accepted, as the
/// API documents), standard (non-Quartz) weekdays.
fn cron_parser() -> CronParser {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build()
}

/// Whole seconds: cron ticks have no fractions, and croner works on seconds.
fn floor_to_second(at: DateTime<Utc>) -> DateTime<Utc> {
    at.with_nanosecond(0).unwrap_or(at)
}

impl Schedule {
    /// Validates `spec` under `name`. Errors name the field at fault as the HTTP API spells it:
    /// `name`, `cron`, `every`, `timezone`, `max_catch_up`, `job.kind`, `job.tags`, ...
    pub fn from_spec(name: impl Into<String>, spec: ScheduleSpec) -> Result<Self, ValidationError> {
        let name = name.into();
        validate::name("name", &name)?;
        if name.len() > MAX_SCHEDULE_NAME_LEN {
            return Err(ValidationError::new(
                "name",
                format!("must be at most {MAX_SCHEDULE_NAME_LEN} characters"),
            ));
        }
        let mut spec = spec;
        spec.cron = spec.cron.trim().to_string();
        let tz = Tz::from_str(spec.timezone.trim()).map_err(|_| {
            ValidationError::new(
                "timezone",
                format!(
                    "unknown time zone {:?}; expected an IANA name such as UTC or Europe/Berlin",
                    spec.timezone
                ),
            )
        })?;
        spec.timezone = tz.name().to_string();
        let ticks = match spec.every.take() {
            Some(_) if !spec.cron.is_empty() => {
                return Err(ValidationError::new(
                    "every",
                    "give either cron or every, not both",
                ))
            }
            Some(every) => {
                let every = every.trim().to_string();
                let seconds = parse_every(&every)?.as_secs() as i64;
                if tz != Tz::UTC {
                    return Err(ValidationError::new(
                        "timezone",
                        "only applies to cron schedules; an interval (every) counts real time \
                         and takes no time zone",
                    ));
                }
                spec.every = Some(every);
                Ticks::Every { seconds }
            }
            None if spec.cron.is_empty() => {
                return Err(ValidationError::new(
                    "cron",
                    "a schedule needs a cron expression (cron) or an interval (every)",
                ))
            }
            None => {
                let cron = cron_parser().parse(&spec.cron).map_err(|e| {
                    ValidationError::new(
                        "cron",
                        format!(
                            "{:?} is not a valid cron expression ({e}); expected 5 fields \
                             (minute hour day-of-month month day-of-week) or 6 with seconds first",
                            spec.cron
                        ),
                    )
                })?;
                Ticks::Cron {
                    cron: Box::new(cron),
                    tz,
                }
            }
        };
        let missed = match (spec.missed, spec.max_catch_up) {
            (MissedKind::Skip, None) => MissedPolicy::Skip,
            (MissedKind::Skip, Some(_)) => {
                return Err(ValidationError::new(
                    "max_catch_up",
                    "only applies with missed: catch_up",
                ))
            }
            (MissedKind::CatchUp, max) => {
                let max = max.unwrap_or(DEFAULT_MAX_CATCH_UP);
                if max == 0 || max > MAX_CATCH_UP_LIMIT {
                    return Err(ValidationError::new(
                        "max_catch_up",
                        format!(
                            "must be from 1 to {MAX_CATCH_UP_LIMIT} (use missed: skip to run no \
                             missed tick)"
                        ),
                    ));
                }
                spec.max_catch_up = Some(max);
                MissedPolicy::CatchUp { max }
            }
        };
        let schedule = Self {
            name,
            spec,
            ticks,
            missed,
        };
        // An expression such as `0 0 30 2 *` parses but never matches: refuse it now rather
        // than leave a schedule that silently never runs.
        let reference = DateTime::<Utc>::from_timestamp(946_684_800, 0).unwrap_or_default();
        if schedule.is_cron() && schedule.next_after(reference).is_none() {
            return Err(ValidationError::new(
                "cron",
                format!("{:?} never matches a date", schedule.spec.cron),
            ));
        }
        // The job of any run must be valid: check it once with a sample tick.
        let template = &schedule.spec.job;
        if template.tags.len() >= validate::MAX_TAGS {
            return Err(ValidationError::new(
                "job.tags",
                format!(
                    "at most {} tags (each run's job also gets the tag {SCHEDULE_TAG_PREFIX}NAME)",
                    validate::MAX_TAGS - 1
                ),
            ));
        }
        validate::new_job(&schedule.job_for(reference)).map_err(|e| ValidationError {
            field: format!("job.{}", e.field),
            message: e.message,
        })?;
        Ok(schedule)
    }

    /// A stored schedule, read back by a store: the same checks as [`Schedule::from_spec`].
    pub fn from_json(name: &str, definition: &str) -> Result<Self, ValidationError> {
        let spec: ScheduleSpec = serde_json::from_str(definition).map_err(|e| {
            ValidationError::new("definition", format!("unreadable stored schedule: {e}"))
        })?;
        Self::from_spec(name, spec)
    }

    /// The spec as JSON, for a store to keep.
    pub fn to_json(&self) -> String {
        // Serializing plain data (strings, numbers, a JSON value) cannot fail.
        serde_json::to_string(&self.spec).unwrap_or_default()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn spec(&self) -> &ScheduleSpec {
        &self.spec
    }

    /// The cron expression; empty for an interval schedule.
    pub fn cron(&self) -> &str {
        &self.spec.cron
    }

    /// The interval of an interval schedule (`None` for a cron schedule).
    pub fn every(&self) -> Option<Duration> {
        match self.ticks {
            Ticks::Every { seconds } => Some(Duration::from_secs(seconds.unsigned_abs())),
            Ticks::Cron { .. } => None,
        }
    }

    fn is_cron(&self) -> bool {
        matches!(self.ticks, Ticks::Cron { .. })
    }

    pub fn timezone(&self) -> &str {
        &self.spec.timezone
    }

    pub fn job(&self) -> &JobTemplate {
        &self.spec.job
    }

    pub fn overlap(&self) -> OverlapPolicy {
        self.spec.overlap
    }

    pub fn missed(&self) -> MissedPolicy {
        self.missed
    }

    /// Whether `other` has the same ticks (same expression and time zone, or the same
    /// interval). Changing them restarts the schedule's clock (an interval counts from then
    /// on); changing only the job or the policies does not. Resuming a paused schedule (`self`
    /// paused, `other` not) counts as new ticks too, so the ticks of the pause are never fired
    /// afterwards, whatever the missed-run policy and however long no scheduler ran.
    pub fn same_ticks(&self, other: &Schedule) -> bool {
        if self.spec.paused && !other.spec.paused {
            return false;
        }
        match (&self.ticks, &other.ticks) {
            (Ticks::Every { seconds: a }, Ticks::Every { seconds: b }) => a == b,
            (Ticks::Cron { .. }, Ticks::Cron { .. }) => {
                self.spec.cron == other.spec.cron && self.spec.timezone == other.spec.timezone
            }
            _ => false,
        }
    }

    /// The first tick of a cron schedule strictly after `after`. An interval schedule's ticks
    /// depend on its anchor: this is `None` for it (see [`Schedule::next_run`]).
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match &self.ticks {
            Ticks::Cron { .. } => self.tick_after(after, after),
            Ticks::Every { .. } => None,
        }
    }

    /// The last tick of a cron schedule at or before `at`; `None` for an interval schedule,
    /// whose ticks depend on its anchor.
    pub fn latest_at_or_before(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match &self.ticks {
            Ticks::Cron { .. } => self.tick_at_or_before(at, at),
            Ticks::Every { .. } => None,
        }
    }

    /// An interval schedule's ticks are `base + k * every` (k >= 1), with `base` its
    /// `due_after` in whole seconds (see the module documentation).
    fn interval_base(due_after: DateTime<Utc>) -> DateTime<Utc> {
        floor_to_second(due_after)
    }

    /// The first tick strictly after `after`, for a schedule handled up to `due_after`.
    fn tick_after(&self, due_after: DateTime<Utc>, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match &self.ticks {
            Ticks::Cron { cron, tz } => {
                let from = floor_to_second(after).with_timezone(tz);
                cron.find_next_occurrence(&from, false)
                    .ok()
                    .map(|t| t.with_timezone(&Utc))
            }
            Ticks::Every { seconds } => {
                let base = Self::interval_base(due_after);
                // Whole seconds since the base, rounded down (the base is a whole second).
                let since = (after - base).num_seconds();
                let k = if after < base { 1 } else { since / seconds + 1 };
                base.checked_add_signed(chrono::Duration::seconds(k.checked_mul(*seconds)?))
            }
        }
    }

    /// The last tick at or before `at`, for a schedule handled up to `due_after`.
    fn tick_at_or_before(
        &self,
        due_after: DateTime<Utc>,
        at: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        match &self.ticks {
            Ticks::Cron { cron, tz } => {
                let from = floor_to_second(at).with_timezone(tz);
                cron.find_previous_occurrence(&from, true)
                    .ok()
                    .map(|t| t.with_timezone(&Utc))
            }
            Ticks::Every { seconds } => {
                let base = Self::interval_base(due_after);
                if at < base {
                    return None;
                }
                let k = (at - base).num_seconds() / seconds;
                if k < 1 {
                    return None;
                }
                base.checked_add_signed(chrono::Duration::seconds(k.checked_mul(*seconds)?))
            }
        }
    }

    /// The last tick strictly before `before` (a tick).
    fn latest_before(&self, before: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match &self.ticks {
            Ticks::Cron { cron, tz } => {
                let from = floor_to_second(before).with_timezone(tz);
                cron.find_previous_occurrence(&from, false)
                    .ok()
                    .map(|t| t.with_timezone(&Utc))
            }
            // The caller stops at due_after, so walking below the base does not matter.
            Ticks::Every { seconds } => {
                before.checked_sub_signed(chrono::Duration::seconds(*seconds))
            }
        }
    }

    /// Which ticks to fire at `now`, for a schedule that has handled every tick up to
    /// `due_after` (its last fired tick, or when it was created or its expression changed).
    ///
    /// Ticks in `(due_after, now]` are due. Those less than `misfire` old are on time and all
    /// fire, so a scheduler that runs late loses nothing. Older ones were missed (no scheduler
    /// ran: downtime, a leader failover): `missed: skip` drops them, `catch_up` fires the
    /// `max` most recent of them (flagged `catch_up`). Either way the schedule then counts as
    /// handled up to the latest due tick ([`Plan::due_after`]), so no tick fires twice.
    pub fn plan(&self, due_after: DateTime<Utc>, now: DateTime<Utc>, misfire: Duration) -> Plan {
        if self.spec.paused {
            // Every tick up to now passes unfired, so resuming starts from the next one.
            return Plan {
                fire: Vec::new(),
                due_after: self
                    .tick_at_or_before(due_after, now)
                    .filter(|at| *at > due_after),
                dropped: 0,
                next: None,
            };
        }
        let misfire = chrono::Duration::from_std(misfire).unwrap_or(chrono::Duration::MAX);
        let on_time_after = now
            .checked_sub_signed(misfire)
            .unwrap_or(DateTime::<Utc>::MIN_UTC);
        let catch_up_max = match self.missed {
            MissedPolicy::Skip => 0,
            MissedPolicy::CatchUp { max } => max as usize,
        };
        let mut fire = Vec::new();
        let mut caught_up = 0;
        let mut dropped = 0;
        let mut latest_due = None;
        // Backwards from now: the on-time ticks, then the most recent missed ones. Walking
        // back bounds the work however long the schedule was down.
        let mut tick = self.tick_at_or_before(due_after, now);
        while let Some(at) = tick.filter(|at| *at > due_after) {
            latest_due.get_or_insert(at);
            if at > on_time_after && fire.len() < MAX_ON_TIME {
                fire.push(PlannedTick {
                    at,
                    catch_up: false,
                });
            } else if at <= on_time_after && caught_up < catch_up_max {
                fire.push(PlannedTick { at, catch_up: true });
                caught_up += 1;
            } else {
                dropped += 1;
                if dropped >= DROPPED_COUNT_CAP {
                    break;
                }
            }
            tick = self.latest_before(at);
        }
        fire.reverse();
        Plan {
            fire,
            due_after: latest_due,
            dropped,
            next: self.tick_after(latest_due.unwrap_or(due_after), now),
        }
    }

    /// When the schedule runs next, as seen at `now` by a schedule handled up to `due_after`.
    pub fn next_run(&self, due_after: DateTime<Utc>, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        if self.spec.paused {
            return None;
        }
        self.tick_after(due_after, due_after.max(now))
    }

    /// The idempotency key of the run at `tick`: `schedule:{name}:{tick}` (RFC 3339, UTC).
    pub fn run_key(&self, tick: DateTime<Utc>) -> String {
        format!(
            "{SCHEDULE_TAG_PREFIX}{}:{}",
            self.name,
            tick.to_rfc3339_opts(SecondsFormat::AutoSi, true)
        )
    }

    /// The job of a run started by hand (`POST /v1/schedules/{name}/trigger`): the template's
    /// job now, tagged like every run plus `manual`, without the tick's idempotency key (a
    /// manual run never takes the place of a tick's).
    pub fn manual_job(&self, now: DateTime<Utc>) -> NewJob {
        let mut job = self.job_for(now);
        job.idempotency_key = None;
        job.run_at = None;
        job.tags.push(MANUAL_RUN_TAG.to_string());
        job
    }

    /// The tag every run's job carries: `schedule:{name}`.
    pub fn run_tag(&self) -> String {
        format!("{SCHEDULE_TAG_PREFIX}{}", self.name)
    }

    /// The job of the run at `tick`: the template, due at the tick, with the run's
    /// idempotency key (a second guard against firing a tick twice) and the schedule's tag.
    pub fn job_for(&self, tick: DateTime<Utc>) -> NewJob {
        let template = &self.spec.job;
        let mut job = NewJob::new(template.kind.clone(), template.payload.clone());
        job.queue = template.queue.clone();
        job.priority = template.priority;
        job.max_attempts = template.max_attempts;
        job.timeout_ms = template.timeout_ms;
        job.tenant = template.tenant.clone();
        job.tags = template.tags.clone();
        job.tags.push(self.run_tag());
        job.idempotency_key = Some(self.run_key(tick));
        // A tick is never in the future when fired: the job is available at once, and a
        // caught-up run keeps its place (older first) among the queue's jobs.
        job.run_at = Some(tick);
        job
    }
}

/// The tag of a schedule's run started by hand.
pub const MANUAL_RUN_TAG: &str = "manual";

/// One tick to fire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedTick {
    pub at: DateTime<Utc>,
    /// Fired by `missed: catch_up` for a tick missed during downtime.
    pub catch_up: bool,
}

/// The outcome of [`Schedule::plan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The ticks to fire, oldest first.
    pub fire: Vec<PlannedTick>,
    /// The latest due tick: the schedule's new `due_after` once this plan is fired. `None`
    /// when nothing is due (then there is nothing to fire).
    pub due_after: Option<DateTime<Utc>>,
    /// Missed ticks dropped by the policy (counted up to 1000).
    pub dropped: u64,
    /// The first tick after now.
    pub next: Option<DateTime<Utc>>,
}

/// What [`crate::ScheduleStore::schedule_fire`] is asked to do: record `ticks` (oldest first) for the
/// schedule `name` as it was at `revision`, and count it handled up to `due_after`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FireRequest {
    pub name: String,
    pub revision: u64,
    pub ticks: Vec<PlannedTick>,
    pub due_after: DateTime<Utc>,
    /// What the runs' jobs are stamped with (their queue's and kind's limit keys and sequence),
    /// computed above the store from the schedule at `revision`.
    pub stamp: RunStamp,
}

/// The stamp of a schedule's runs' jobs (see `conveyor_engine::LimitStamps`): the same for
/// every run, since a run's job differs from the template only in its time, key and tag.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunStamp {
    pub limit_keys: Vec<String>,
    pub sequence_key: Option<crate::sequence::SequenceKey>,
}

impl RunStamp {
    /// `job` (a run's, from [`Schedule::job_for`]) stamped.
    pub fn apply(&self, mut job: NewJob) -> NewJob {
        job.limit_keys = self.limit_keys.clone();
        job.sequence_key = self.sequence_key.clone();
        job
    }
}

impl FireRequest {
    /// The request firing `plan` for `view`; `None` when nothing is due.
    pub fn from_plan(view: &ScheduleView, plan: &Plan) -> Option<Self> {
        Some(Self {
            name: view.schedule.name.clone(),
            revision: view.revision,
            ticks: plan.fire.clone(),
            due_after: plan.due_after?,
            stamp: RunStamp::default(),
        })
    }

    /// Checks the request against the stored `due_after`: ticks strictly increasing, each
    /// after it, none after the new one. A store calls this before firing.
    pub fn check(&self, stored_due_after: DateTime<Utc>) -> Result<(), ValidationError> {
        if self.due_after <= stored_due_after {
            return Err(ValidationError::new(
                "due_after",
                "must be later than the schedule's current due_after",
            ));
        }
        let mut previous = stored_due_after;
        for tick in &self.ticks {
            if tick.at <= previous {
                return Err(ValidationError::new(
                    "ticks",
                    "must be strictly increasing and after the schedule's due_after",
                ));
            }
            previous = tick.at;
        }
        if previous > self.due_after {
            return Err(ValidationError::new("ticks", "must not be after due_after"));
        }
        Ok(())
    }
}

/// The outcome of [`crate::ScheduleStore::schedule_fire`].
#[derive(Debug, Clone, PartialEq)]
pub enum FireOutcome {
    /// The ticks were recorded, one run each, in order.
    Fired(Vec<ScheduleRun>),
    /// The schedule changed since it was read (another node fired it, it was updated or
    /// deleted): nothing was recorded. Read it again and plan anew.
    Conflict,
}

/// What became of one tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// The run's job was enqueued (`job_id`).
    Enqueued,
    /// `overlap: skip` and the previous run's job was unfinished: nothing enqueued.
    SkippedOverlap,
    /// The store refused the job (its queue was full, ...): nothing enqueued; `detail` says why.
    Refused,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Enqueued => "enqueued",
            RunStatus::SkippedOverlap => "skipped_overlap",
            RunStatus::Refused => "refused",
        }
    }
}

impl FromStr for RunStatus {
    type Err = ValidationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            RunStatus::Enqueued,
            RunStatus::SkippedOverlap,
            RunStatus::Refused,
        ]
        .into_iter()
        .find(|status| status.as_str() == s)
        .ok_or_else(|| ValidationError::new("status", format!("unknown run status {s:?}")))
    }
}

/// One tick of a schedule and what became of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleRun {
    pub schedule: String,
    pub tick: DateTime<Utc>,
    pub fired_at: DateTime<Utc>,
    pub status: RunStatus,
    pub catch_up: bool,
    pub job_id: Option<Uuid>,
    /// The job's state when read (`None` when there is no job, or it was deleted): a failed
    /// run shows as `dead`.
    pub job_state: Option<JobState>,
    pub detail: Option<String>,
}

impl ScheduleRun {
    /// The run of `schedule` for `tick`, fired at `fired_at`, as enqueued until decided otherwise.
    pub fn pending(schedule: &str, tick: &PlannedTick, fired_at: DateTime<Utc>) -> Self {
        Self {
            schedule: schedule.to_string(),
            tick: tick.at,
            fired_at,
            status: RunStatus::Enqueued,
            catch_up: tick.catch_up,
            job_id: None,
            job_state: None,
            detail: None,
        }
    }

    /// The run enqueued `inserted` (or found it, for a duplicate): its id, to watch for overlap.
    pub fn enqueued(&mut self, inserted: &crate::Inserted) -> Uuid {
        if inserted.duplicate {
            self.detail = Some(DUPLICATE_DETAIL.to_string());
        }
        self.job_id = Some(inserted.job.id);
        self.job_state = Some(inserted.job.state);
        inserted.job.id
    }

    /// Under `overlap: skip`, whether the previous run's job (`last_job`, in `state` when read)
    /// still runs, in which case this run is skipped. Returns true when skipped.
    pub fn skipped_for_overlap(&mut self, last_job: Option<(Uuid, Option<JobState>)>) -> bool {
        match last_job {
            Some((id, Some(state))) if !state.is_finished() => {
                self.status = RunStatus::SkippedOverlap;
                self.detail = Some(overlap_detail(id, state));
                true
            }
            _ => false,
        }
    }

    /// The store refused the run's job (queue full, invalid job): nothing enqueued.
    pub fn refused(&mut self, reason: &crate::StoreError) {
        self.status = RunStatus::Refused;
        self.detail = Some(reason.to_string());
    }
}

/// A stored schedule with its state and recent runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScheduleView {
    #[serde(flatten)]
    pub schedule: Schedule,
    /// Changes with every update and every firing; [`FireRequest::revision`] must match it.
    pub revision: u64,
    /// Every tick up to this instant has been handled (fired or dropped).
    pub due_after: DateTime<Utc>,
    /// The last tick fired (`None` before the first).
    pub last_tick: Option<DateTime<Utc>>,
    /// When the next run is due (in the past while a due tick waits for the scheduler).
    pub next_run_at: Option<DateTime<Utc>>,
    /// The latest run, with its job's state.
    pub last_run: Option<ScheduleRun>,
    /// The latest runs, newest first ([`RECENT_RUNS`] in a single view; empty in lists).
    pub recent_runs: Vec<ScheduleRun>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// The detail recorded for a run whose job already existed (its idempotency key matched).
pub const DUPLICATE_DETAIL: &str =
    "a job with this run's idempotency key already existed; it is the run's job";

/// The detail recorded for a run skipped by `overlap: skip`.
pub fn overlap_detail(job_id: Uuid, state: JobState) -> String {
    format!("the previous run's job {job_id} is still {state}")
}

#[cfg(test)]
mod tests;
