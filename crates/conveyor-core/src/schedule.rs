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
}

impl FireRequest {
    /// The request firing `plan` for `view`; `None` when nothing is due.
    pub fn from_plan(view: &ScheduleView, plan: &Plan) -> Option<Self> {
        Some(Self {
            name: view.schedule.name.clone(),
            revision: view.revision,
            ticks: plan.fire.clone(),
            due_after: plan.due_after?,
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
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, s).unwrap()
    }

    fn schedule(cron: &str, timezone: &str) -> Schedule {
        let spec = ScheduleSpec::new(cron, JobTemplate::new("tick", serde_json::json!({})))
            .timezone(timezone);
        Schedule::from_spec("s", spec).unwrap()
    }

    fn field_of(result: Result<Schedule, ValidationError>) -> String {
        result.expect_err("should be invalid").field
    }

    /// Every tick in `(from, to]`, walking forwards.
    fn ticks(s: &Schedule, from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<DateTime<Utc>> {
        let mut out = Vec::new();
        let mut at = from;
        while let Some(next) = s.next_after(at).filter(|t| *t <= to) {
            out.push(next);
            at = next;
        }
        out
    }

    /// Every tick the planner fires when called every `step` from `from` to `to` (on time).
    fn driven(
        s: &Schedule,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        step: i64,
    ) -> Vec<DateTime<Utc>> {
        let mut due_after = from;
        let mut fired = Vec::new();
        let mut now = from;
        while now <= to {
            let plan = s.plan(due_after, now, DEFAULT_MISFIRE_THRESHOLD);
            assert!(plan.fire.iter().all(|t| !t.catch_up));
            fired.extend(plan.fire.iter().map(|t| t.at));
            if let Some(d) = plan.due_after {
                due_after = d;
            }
            now += chrono::Duration::seconds(step);
        }
        fired
    }

    #[test]
    fn five_and_six_field_expressions_parse() {
        let five = schedule("*/15 * * * *", "UTC");
        assert_eq!(
            five.next_after(utc(2026, 1, 1, 0, 0, 0)),
            Some(utc(2026, 1, 1, 0, 15, 0))
        );
        let six = schedule("*/10 * * * * *", "UTC");
        assert_eq!(
            six.next_after(utc(2026, 1, 1, 0, 0, 0)),
            Some(utc(2026, 1, 1, 0, 0, 10))
        );
        let nickname = schedule("@daily", "UTC");
        assert_eq!(
            nickname.next_after(utc(2026, 1, 1, 0, 0, 0)),
            Some(utc(2026, 1, 2, 0, 0, 0))
        );
        // A fractional "after" still excludes the tick at its whole second.
        assert_eq!(
            six.next_after(utc(2026, 1, 1, 0, 0, 10) + chrono::Duration::milliseconds(300)),
            Some(utc(2026, 1, 1, 0, 0, 20))
        );
    }

    #[test]
    fn bad_input_names_the_field() {
        let job = || JobTemplate::new("tick", serde_json::json!({}));
        for bad in [
            "",
            "* * * *",
            "61 * * * *",
            "* * * * * * *",
            "0 0 1 1 * 2030",
            "nonsense",
        ] {
            let spec = ScheduleSpec::new(bad, job());
            assert_eq!(field_of(Schedule::from_spec("s", spec)), "cron", "{bad:?}");
        }
        let never = ScheduleSpec::new("0 0 30 2 *", job());
        assert_eq!(field_of(Schedule::from_spec("s", never)), "cron");
        let zone = ScheduleSpec::new("* * * * *", job()).timezone("Mars/Olympus_Mons");
        let err = Schedule::from_spec("s", zone).unwrap_err();
        assert_eq!(err.field, "timezone");
        assert!(err.message.contains("Mars/Olympus_Mons"), "{err}");
        let mut kind = ScheduleSpec::new("* * * * *", job());
        kind.job.kind = "bad kind".into();
        assert_eq!(field_of(Schedule::from_spec("s", kind)), "job.kind");
        let mut queue = ScheduleSpec::new("* * * * *", job());
        queue.job.queue = String::new();
        assert_eq!(field_of(Schedule::from_spec("s", queue)), "job.queue");
        let mut tags = ScheduleSpec::new("* * * * *", job());
        tags.job.tags = (0..validate::MAX_TAGS).map(|i| format!("t{i}")).collect();
        assert_eq!(field_of(Schedule::from_spec("s", tags)), "job.tags");
        let mut skip_with_max = ScheduleSpec::new("* * * * *", job());
        skip_with_max.max_catch_up = Some(3);
        assert_eq!(
            field_of(Schedule::from_spec("s", skip_with_max)),
            "max_catch_up"
        );
        for max in [0, MAX_CATCH_UP_LIMIT + 1] {
            let spec = ScheduleSpec::new("* * * * *", job()).missed(MissedPolicy::CatchUp { max });
            assert_eq!(field_of(Schedule::from_spec("s", spec)), "max_catch_up");
        }
        for name in ["", "has space", &"n".repeat(MAX_SCHEDULE_NAME_LEN + 1)] {
            let spec = ScheduleSpec::new("* * * * *", job());
            assert_eq!(field_of(Schedule::from_spec(name, spec)), "name");
        }
    }

    #[test]
    fn defaults_and_round_trip() {
        let s = schedule("0 3 * * *", "Europe/Berlin");
        assert_eq!(s.overlap(), OverlapPolicy::Skip);
        assert_eq!(s.missed(), MissedPolicy::Skip);
        let spec: ScheduleSpec = serde_json::from_str(
            r#"{"cron": "0 3 * * *", "job": {"kind": "k"}, "missed": "catch_up"}"#,
        )
        .unwrap();
        let parsed = Schedule::from_spec("n", spec).unwrap();
        assert_eq!(parsed.timezone(), "UTC");
        assert_eq!(
            parsed.missed(),
            MissedPolicy::CatchUp {
                max: DEFAULT_MAX_CATCH_UP
            }
        );
        assert_eq!(parsed.job().queue, DEFAULT_QUEUE);
        assert_eq!(parsed.job().payload, Value::Null);
        let back = Schedule::from_json("n", &parsed.to_json()).unwrap();
        assert_eq!(back, parsed);
        let json = serde_json::to_value(&parsed).unwrap();
        assert_eq!(json["name"], "n");
        assert_eq!(json["missed"], "catch_up");
        assert_eq!(json["max_catch_up"], DEFAULT_MAX_CATCH_UP);
        assert_eq!(json["overlap"], "skip");
        assert!(serde_json::from_str::<ScheduleSpec>(
            r#"{"cron": "* * * * *", "job": {"kind": "k"}, "bogus": 1}"#
        )
        .is_err());
    }

    #[test]
    fn run_jobs_carry_key_tag_and_tick() {
        let mut spec = ScheduleSpec::new(
            "* * * * * *",
            JobTemplate::new("k", serde_json::json!({"a": 1})),
        );
        spec.job.tags = vec!["mine".into()];
        spec.job.queue = "q".into();
        let s = Schedule::from_spec("every-second", spec).unwrap();
        let tick = utc(2026, 5, 1, 12, 0, 1);
        let job = s.job_for(tick);
        assert_eq!(
            job.idempotency_key.as_deref(),
            Some("schedule:every-second:2026-05-01T12:00:01Z")
        );
        assert_eq!(
            job.tags,
            vec!["mine".to_string(), "schedule:every-second".to_string()]
        );
        assert_eq!(job.run_at, Some(tick));
        assert_eq!(job.queue, "q");
        assert_eq!(job.payload, serde_json::json!({"a": 1}));
    }

    #[test]
    fn plan_fires_each_due_tick_once() {
        let s = schedule("* * * * * *", "UTC");
        let t0 = utc(2026, 5, 1, 12, 0, 0) + chrono::Duration::milliseconds(400);
        // Nothing due before the first tick.
        let plan = s.plan(
            t0,
            t0 + chrono::Duration::milliseconds(500),
            DEFAULT_MISFIRE_THRESHOLD,
        );
        assert!(plan.fire.is_empty());
        assert_eq!(plan.due_after, None);
        assert_eq!(plan.next, Some(utc(2026, 5, 1, 12, 0, 1)));
        // Late by 2.5 s, within the threshold: every tick fires, in order.
        let now = utc(2026, 5, 1, 12, 0, 3) + chrono::Duration::milliseconds(500);
        let plan = s.plan(t0, now, DEFAULT_MISFIRE_THRESHOLD);
        let at: Vec<_> = plan.fire.iter().map(|t| t.at).collect();
        assert_eq!(
            at,
            vec![
                utc(2026, 5, 1, 12, 0, 1),
                utc(2026, 5, 1, 12, 0, 2),
                utc(2026, 5, 1, 12, 0, 3)
            ]
        );
        assert_eq!(plan.due_after, Some(utc(2026, 5, 1, 12, 0, 3)));
        assert_eq!(plan.dropped, 0);
        // From there, the same instant plans nothing more.
        let again = s.plan(plan.due_after.unwrap(), now, DEFAULT_MISFIRE_THRESHOLD);
        assert!(again.fire.is_empty() && again.due_after.is_none());
        // Driven every 300 ms for a minute: each second exactly once.
        let mut due_after = t0;
        let mut all = Vec::new();
        let mut now = t0;
        for _ in 0..200 {
            now += chrono::Duration::milliseconds(300);
            let plan = s.plan(due_after, now, DEFAULT_MISFIRE_THRESHOLD);
            all.extend(plan.fire.iter().map(|t| t.at));
            due_after = plan.due_after.unwrap_or(due_after);
        }
        assert_eq!(all, ticks(&s, t0, now));
        assert_eq!(all.len(), 60);
    }

    #[test]
    fn missed_ticks_are_skipped_or_caught_up_to_the_maximum() {
        let spec = ScheduleSpec::new("* * * * * *", JobTemplate::new("k", Value::Null));
        let skip = Schedule::from_spec("s", spec.clone()).unwrap();
        let catch_up =
            Schedule::from_spec("s", spec.missed(MissedPolicy::CatchUp { max: 3 })).unwrap();
        let down_at = utc(2026, 5, 1, 12, 0, 0);
        // Back after 10 s with a 2 s threshold: 12:00:09 and :10 are on time, :01 to :08 missed.
        let now = utc(2026, 5, 1, 12, 0, 10) + chrono::Duration::milliseconds(200);
        let misfire = Duration::from_secs(2);
        let plan = skip.plan(down_at, now, misfire);
        assert_eq!(
            plan.fire,
            vec![
                PlannedTick {
                    at: utc(2026, 5, 1, 12, 0, 9),
                    catch_up: false
                },
                PlannedTick {
                    at: utc(2026, 5, 1, 12, 0, 10),
                    catch_up: false
                },
            ]
        );
        assert_eq!(plan.dropped, 8);
        assert_eq!(plan.due_after, Some(utc(2026, 5, 1, 12, 0, 10)));
        let plan = catch_up.plan(down_at, now, misfire);
        let caught: Vec<_> = plan
            .fire
            .iter()
            .filter(|t| t.catch_up)
            .map(|t| t.at)
            .collect();
        assert_eq!(
            caught,
            vec![
                utc(2026, 5, 1, 12, 0, 6),
                utc(2026, 5, 1, 12, 0, 7),
                utc(2026, 5, 1, 12, 0, 8)
            ]
        );
        assert_eq!(plan.fire.len(), 5);
        assert_eq!(plan.dropped, 5);
        // Oldest first, never a tick twice.
        assert!(plan.fire.windows(2).all(|w| w[0].at < w[1].at));
        // A long outage costs bounded work: a year of seconds, dropped count capped.
        let long = skip.plan(down_at - chrono::Duration::days(365), now, misfire);
        assert_eq!(long.fire.len(), 2);
        assert_eq!(long.dropped, DROPPED_COUNT_CAP);
        assert_eq!(long.due_after, Some(utc(2026, 5, 1, 12, 0, 10)));
        // A daily schedule down over its hour: skip drops it, catch_up runs it once.
        let daily = ScheduleSpec::new("0 3 * * *", JobTemplate::new("k", Value::Null));
        let skip_daily = Schedule::from_spec("d", daily.clone()).unwrap();
        let catch_daily =
            Schedule::from_spec("d", daily.missed(MissedPolicy::CatchUp { max: 1 })).unwrap();
        let (from, now) = (utc(2026, 5, 1, 2, 0, 0), utc(2026, 5, 3, 4, 0, 0));
        let p = skip_daily.plan(from, now, DEFAULT_MISFIRE_THRESHOLD);
        assert!(p.fire.is_empty());
        assert_eq!(p.dropped, 3);
        assert_eq!(p.due_after, Some(utc(2026, 5, 3, 3, 0, 0)));
        let p = catch_daily.plan(from, now, DEFAULT_MISFIRE_THRESHOLD);
        assert_eq!(
            p.fire,
            vec![PlannedTick {
                at: utc(2026, 5, 3, 3, 0, 0),
                catch_up: true
            }]
        );
        assert_eq!(p.dropped, 2);
    }

    // Europe/Berlin, 2026: clocks go from 02:00 CET (UTC+1) to 03:00 CEST (UTC+2) on March 29
    // at 01:00 UTC, and from 03:00 CEST back to 02:00 CET on October 25 at 01:00 UTC.

    #[test]
    fn berlin_spring_forward_fixed_time_runs_once_after_the_gap() {
        let s = schedule("30 2 * * *", "Europe/Berlin");
        let fired = driven(
            &s,
            utc(2026, 3, 27, 12, 0, 0),
            utc(2026, 3, 31, 12, 0, 0),
            600,
        );
        assert_eq!(
            fired,
            vec![
                utc(2026, 3, 28, 1, 30, 0), // 02:30 CET
                utc(2026, 3, 29, 1, 0, 0),  // 02:30 does not exist: 03:00 CEST, once
                utc(2026, 3, 30, 0, 30, 0), // 02:30 CEST
                utc(2026, 3, 31, 0, 30, 0),
            ]
        );
    }

    #[test]
    fn berlin_spring_forward_interval_skips_the_missing_hour() {
        let hourly = schedule("0 * * * *", "Europe/Berlin");
        let fired = driven(
            &hourly,
            utc(2026, 3, 28, 22, 30, 0),
            utc(2026, 3, 29, 3, 30, 0),
            60,
        );
        // Local 00:00, 01:00, (02:00 does not exist), 03:00, 04:00, 05:00: every real hour once.
        assert_eq!(
            fired,
            vec![
                utc(2026, 3, 28, 23, 0, 0),
                utc(2026, 3, 29, 0, 0, 0),
                utc(2026, 3, 29, 1, 0, 0),
                utc(2026, 3, 29, 2, 0, 0),
                utc(2026, 3, 29, 3, 0, 0),
            ]
        );
        let quarter = schedule("*/30 2 * * *", "Europe/Berlin");
        let fired = driven(
            &quarter,
            utc(2026, 3, 27, 12, 0, 0),
            utc(2026, 3, 30, 12, 0, 0),
            300,
        );
        // 02:00 and 02:30 exist on the 28th and 30th only; on the 29th there is no 2 o'clock.
        assert_eq!(
            fired,
            vec![
                utc(2026, 3, 29, 1, 0, 0) - chrono::Duration::days(1),
                utc(2026, 3, 29, 1, 30, 0) - chrono::Duration::days(1),
                utc(2026, 3, 30, 0, 0, 0),
                utc(2026, 3, 30, 0, 30, 0),
            ]
        );
    }

    #[test]
    fn berlin_fall_back_fixed_time_runs_once_interval_runs_every_real_hour() {
        let daily = schedule("30 2 * * *", "Europe/Berlin");
        let fired = driven(
            &daily,
            utc(2026, 10, 24, 12, 0, 0),
            utc(2026, 10, 26, 12, 0, 0),
            300,
        );
        // 02:30 happens twice on the 25th (00:30 UTC in CEST, 01:30 UTC in CET): once, the first.
        assert_eq!(
            fired,
            vec![utc(2026, 10, 25, 0, 30, 0), utc(2026, 10, 26, 1, 30, 0),]
        );
        let hourly = schedule("0 * * * *", "Europe/Berlin");
        let fired = driven(
            &hourly,
            utc(2026, 10, 24, 22, 30, 0),
            utc(2026, 10, 25, 3, 30, 0),
            60,
        );
        // Local 01:00 CEST, 02:00 CEST, 02:00 CET, 03:00 CET, 04:00: each real hour once.
        assert_eq!(
            fired,
            vec![
                utc(2026, 10, 24, 23, 0, 0),
                utc(2026, 10, 25, 0, 0, 0),
                utc(2026, 10, 25, 1, 0, 0),
                utc(2026, 10, 25, 2, 0, 0),
                utc(2026, 10, 25, 3, 0, 0),
            ]
        );
    }

    #[test]
    fn backward_planning_agrees_with_forward_walks_across_dst() {
        // The planner walks backwards; a walk forwards must find the same ticks.
        for cron in ["30 2 * * *", "0 * * * *", "*/20 1-3 * * *", "15 2 * * SUN"] {
            let s = schedule(cron, "Europe/Berlin");
            for (from, to) in [
                (utc(2026, 3, 26, 0, 0, 0), utc(2026, 4, 2, 0, 0, 0)),
                (utc(2026, 10, 22, 0, 0, 0), utc(2026, 10, 29, 0, 0, 0)),
            ] {
                let forward = ticks(&s, from, to);
                let plan = s.plan(from, to, Duration::from_secs(30 * 86_400));
                let planned: Vec<_> = plan.fire.iter().map(|t| t.at).collect();
                assert_eq!(planned, forward, "{cron} from {from}");
                let mut dedup = planned.clone();
                dedup.dedup();
                assert_eq!(dedup, planned, "{cron}: no tick twice");
            }
        }
    }

    fn interval(every: &str) -> Schedule {
        let spec = ScheduleSpec::every(every, JobTemplate::new("tick", serde_json::json!({})));
        Schedule::from_spec("s", spec).unwrap()
    }

    #[test]
    fn intervals_parse() {
        for (text, secs) in [
            ("30s", 30),
            ("1s", 1),
            ("5m", 300),
            ("1h30m", 5_400),
            ("2d", 172_800),
            ("1w", 604_800),
            (" 90s ", 90),
            ("1h0m5s", 3_605),
            ("366d", 366 * 86_400),
        ] {
            assert_eq!(
                parse_every(text).unwrap(),
                Duration::from_secs(secs),
                "{text:?}"
            );
        }
        for bad in [
            "",
            "0s",
            "0m0s",
            "abc",
            "30",
            "1h30",
            "s",
            "-5s",
            "1.5h",
            "30 s",
            "5ms",
            "367d",
            "99999999999999999999s",
            "18446744073709551615w",
        ] {
            let err = parse_every(bad).unwrap_err();
            assert_eq!(err.field, "every", "{bad:?}");
            assert!(err.message.contains(&format!("{:?}", bad)), "{err}");
        }
    }

    #[test]
    fn interval_specs_are_checked() {
        let job = || JobTemplate::new("tick", serde_json::json!({}));
        let mut both = ScheduleSpec::every("30s", job());
        both.cron = "* * * * *".into();
        assert_eq!(field_of(Schedule::from_spec("s", both)), "every");
        let neither = ScheduleSpec::new("", job());
        assert_eq!(field_of(Schedule::from_spec("s", neither)), "cron");
        let blank = ScheduleSpec::new("  ", job());
        assert_eq!(field_of(Schedule::from_spec("s", blank)), "cron");
        for bad in ["0s", "abc", "30"] {
            let spec = ScheduleSpec::every(bad, job());
            assert_eq!(field_of(Schedule::from_spec("s", spec)), "every");
        }
        // Time zones are for cron only: an interval takes UTC (the default) or nothing.
        let zoned = ScheduleSpec::every("30s", job()).timezone("Europe/Berlin");
        assert_eq!(field_of(Schedule::from_spec("s", zoned)), "timezone");
        let utc_zone = ScheduleSpec::every(" 30s ", job()).timezone("UTC");
        let s = Schedule::from_spec("s", utc_zone).unwrap();
        assert_eq!(s.every(), Some(Duration::from_secs(30)));
        assert_eq!(s.spec().every.as_deref(), Some("30s"));
        assert_eq!(s.cron(), "");
        // Round trip, and `cron` is left out of an interval schedule's JSON.
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["every"], "30s");
        assert!(json.get("cron").is_none());
        assert_eq!(Schedule::from_json("s", &s.to_json()).unwrap(), s);
        let parsed: ScheduleSpec = serde_json::from_str(
            r#"{"every": "1h30m", "job": {"kind": "k"}, "missed": "catch_up"}"#,
        )
        .unwrap();
        let parsed = Schedule::from_spec("n", parsed).unwrap();
        assert_eq!(parsed.every(), Some(Duration::from_secs(5_400)));
        // A given cron must say something, even beside every.
        assert!(serde_json::from_str::<ScheduleSpec>(
            r#"{"cron": " ", "every": "30s", "job": {"kind": "k"}}"#
        )
        .is_err());
        // A cron schedule's JSON has no `every`, as before.
        let cron = schedule("0 3 * * *", "UTC");
        assert!(serde_json::to_value(&cron).unwrap().get("every").is_none());
        assert_eq!(cron.every(), None);
        // Same interval (however written) keeps the anchor; another interval or cron does not.
        assert!(interval("90s").same_ticks(&interval("1m30s")));
        assert!(!interval("90s").same_ticks(&interval("2m")));
        assert!(!interval("1m").same_ticks(&schedule("* * * * *", "UTC")));
        assert!(!schedule("* * * * *", "UTC").same_ticks(&interval("1m")));
    }

    #[test]
    fn interval_ticks_count_from_the_anchor() {
        let s = interval("30s");
        // Created at 12:00:07.250: ticks at :37, 12:01:07, ... (whole seconds from the anchor).
        let anchor = utc(2026, 5, 1, 12, 0, 7) + chrono::Duration::milliseconds(250);
        assert_eq!(s.next_after(anchor), None);
        assert_eq!(s.next_run(anchor, anchor), Some(utc(2026, 5, 1, 12, 0, 37)));
        let plan = s.plan(
            anchor,
            utc(2026, 5, 1, 12, 0, 36),
            DEFAULT_MISFIRE_THRESHOLD,
        );
        assert!(plan.fire.is_empty() && plan.due_after.is_none());
        assert_eq!(plan.next, Some(utc(2026, 5, 1, 12, 0, 37)));
        let now = utc(2026, 5, 1, 12, 0, 38);
        let plan = s.plan(anchor, now, DEFAULT_MISFIRE_THRESHOLD);
        assert_eq!(
            plan.fire,
            vec![PlannedTick {
                at: utc(2026, 5, 1, 12, 0, 37),
                catch_up: false
            }]
        );
        assert_eq!(plan.due_after, Some(utc(2026, 5, 1, 12, 0, 37)));
        assert_eq!(plan.next, Some(utc(2026, 5, 1, 12, 1, 7)));
        // From the fired tick on, the same lattice; driven every 3 s for 10 minutes: each
        // tick exactly once.
        let fired = driven(&s, anchor, anchor + chrono::Duration::minutes(10), 3);
        assert_eq!(fired.len(), 20);
        for (k, at) in fired.iter().enumerate() {
            assert_eq!(
                *at,
                utc(2026, 5, 1, 12, 0, 7) + chrono::Duration::seconds(30 * (k as i64 + 1))
            );
        }
        // A tick exactly at "now" is due; the next one is a whole interval later.
        let tick = utc(2026, 5, 1, 12, 1, 7);
        let plan = s.plan(utc(2026, 5, 1, 12, 0, 37), tick, DEFAULT_MISFIRE_THRESHOLD);
        assert_eq!(plan.due_after, Some(tick));
        assert_eq!(s.next_run(tick, tick), Some(utc(2026, 5, 1, 12, 1, 37)));
    }

    #[test]
    fn interval_missed_ticks_follow_the_policy() {
        let spec = ScheduleSpec::every("10s", JobTemplate::new("k", Value::Null));
        let skip = Schedule::from_spec("s", spec.clone()).unwrap();
        let catch_up =
            Schedule::from_spec("s", spec.missed(MissedPolicy::CatchUp { max: 2 })).unwrap();
        let last = utc(2026, 5, 1, 12, 0, 0);
        // Down for 94 s: ticks :10 .. 1:30 are due; only 1:30 is on time (threshold 5 s).
        let now = utc(2026, 5, 1, 12, 1, 34);
        let plan = skip.plan(last, now, DEFAULT_MISFIRE_THRESHOLD);
        assert_eq!(
            plan.fire,
            vec![PlannedTick {
                at: utc(2026, 5, 1, 12, 1, 30),
                catch_up: false
            }]
        );
        assert_eq!(plan.dropped, 8);
        assert_eq!(plan.due_after, Some(utc(2026, 5, 1, 12, 1, 30)));
        assert_eq!(plan.next, Some(utc(2026, 5, 1, 12, 1, 40)));
        let plan = catch_up.plan(last, now, DEFAULT_MISFIRE_THRESHOLD);
        let at: Vec<_> = plan.fire.iter().map(|t| (t.at, t.catch_up)).collect();
        assert_eq!(
            at,
            vec![
                (utc(2026, 5, 1, 12, 1, 10), true),
                (utc(2026, 5, 1, 12, 1, 20), true),
                (utc(2026, 5, 1, 12, 1, 30), false),
            ]
        );
        assert_eq!(plan.dropped, 6);
        // A year down on a 1 s interval: bounded work.
        let long = skip.plan(
            last - chrono::Duration::days(365),
            now,
            DEFAULT_MISFIRE_THRESHOLD,
        );
        assert_eq!(long.dropped, DROPPED_COUNT_CAP);
        assert_eq!(long.due_after, Some(utc(2026, 5, 1, 12, 1, 30)));
    }

    #[test]
    fn fire_requests_are_checked() {
        let base = utc(2026, 1, 1, 0, 0, 0);
        let tick = |s: i64| PlannedTick {
            at: base + chrono::Duration::seconds(s),
            catch_up: false,
        };
        let request = |ticks: Vec<PlannedTick>, due: i64| FireRequest {
            name: "s".into(),
            revision: 1,
            ticks,
            due_after: base + chrono::Duration::seconds(due),
        };
        assert!(request(vec![tick(1), tick(2)], 2).check(base).is_ok());
        assert!(request(vec![], 5).check(base).is_ok());
        assert!(request(vec![tick(2), tick(1)], 2).check(base).is_err());
        assert!(request(vec![tick(0)], 2).check(base).is_err());
        assert!(request(vec![tick(3)], 2).check(base).is_err());
        assert!(request(vec![], 0).check(base).is_err());
    }
}
