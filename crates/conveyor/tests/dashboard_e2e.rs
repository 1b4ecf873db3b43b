//! The dashboard in a real browser: `conveyor serve` (with `--auth` when this build has access
//! control) on a temp SQLite store, a `conveyor work --exec` worker, and headless Chromium
//! driven through chromedriver (WebDriver, via fantoccini). The test signs in, reads the live
//! counts, opens the dead job, replays it and watches it complete without reloading the page,
//! sees a queue's circuit breaker opened through the API and closes and reopens it from the
//! page, reads the history charts (1 h, 24 h, Live) and the Kinds view, creates, pauses, runs
//! and resumes a schedule, quiets and resumes a worker, sees a replay marked in a job's
//! history, reads named limits (the Limits page, one limit's keys, a job a full key holds
//! back, a queue's limits in its settings), signs in again as a `viewer` (everything readable,
//! every change disabled), and writes screenshots of the main pages to `docs/screenshots/`.
//! Along the way every view (the sign-in page, each page with its data, the queue settings and
//! schedule forms, the confirmation dialog, the limits, the API reference) is checked with
//! axe-core in the light and the dark colour scheme: no serious or critical violation of its
//! WCAG 2 A and AA rules, and no empty table header.
//!
//! Needs `chromium` and `chromedriver` on the PATH (Debian: `apt-get install chromium
//! chromium-driver`; `.ci/run` installs them), or `CONVEYOR_CHROMIUM` / `CONVEYOR_CHROMEDRIVER`,
//! and axe-core in `tests/a11y/node_modules` (`npm ci --prefix crates/conveyor/tests/a11y`;
//! `scripts/test.sh` runs it).

mod common;

use anyhow::{anyhow, bail, ensure, Context};
use common::{path_in, start_server, temp_dir, try_eventually_within, Server, BIN};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Longest any one condition may take to show up in the page.
const DEADLINE: Duration = Duration::from_secs(30);
/// The laptop screen the dashboard is laid out for; screenshots are taken at this size.
const WINDOW: (u32, u32) = (1366, 768);

/// A process in a process group of its own, killed as a group when dropped: chromedriver
/// starts Chromium and its helpers, and none of them may outlive the test, even when it fails
/// before the WebDriver session is closed.
struct Group {
    child: Child,
}

impl Group {
    fn spawn(command: &mut Command) -> anyhow::Result<Self> {
        use std::os::unix::process::CommandExt;
        let child = command
            .process_group(0)
            .spawn()
            .with_context(|| format!("cannot start {command:?}"))?;
        Ok(Group { child })
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: signals the process group this test created (its id is the child's pid).
        unsafe {
            libc::kill(-(self.child.id() as i32), libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

fn find_program(env: &str, names: &[&str]) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(env) {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |name| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// Whether this build has access control (`conveyor serve --auth`).
fn auth_supported() -> bool {
    Command::new(BIN)
        .args(["serve", "--help"])
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).contains("--auth"))
        .unwrap_or(false)
}

/// `conveyor token create --role admin` on the store; the token is the `cv_...` word it prints.
fn create_admin_token(store: &str) -> anyhow::Result<String> {
    let out = Command::new(BIN)
        .args([
            "token",
            "create",
            "--role",
            "admin",
            "--name",
            "dashboard-e2e",
            "--store",
            store,
        ])
        .env("CONVEYOR_LOG", "warn")
        .output()
        .context("running conveyor token create")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "token create failed: {}{}",
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .split(|c: char| c.is_whitespace() || c == '"' || c == ',')
        .find(|word| word.starts_with("cv_"))
        .map(str::to_string)
        .ok_or_else(|| anyhow!("no cv_ token in {stdout:?}"))
}

/// The JSON API as the test's producer uses it.
#[derive(Clone)]
struct Api {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl Api {
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Value,
    ) -> anyhow::Result<Value> {
        let mut request = self
            .http
            .request(method.clone(), format!("{}{path}", self.base))
            .json(&body);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await?;
        let status = response.status();
        let text = response.text().await?;
        ensure!(status.is_success(), "{method} {path}: {status} {text}");
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    async fn enqueue(&self, body: Value) -> anyhow::Result<String> {
        let job = self.send(reqwest::Method::POST, "/v1/jobs", body).await?;
        job["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow!("no id in {job}"))
    }
}

/// Polls `check` until it yields a value or the deadline passes; no fixed sleeps anywhere.
/// A timeout is an error (not a panic), so the test can screenshot the failure.
async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let last_error = std::cell::RefCell::new(None);
    let found = try_eventually_within(what, DEADLINE, || {
        let checked = check();
        let last_error = &last_error;
        async move {
            match checked.await {
                Ok(Some(value)) => Ok(value),
                Ok(None) => Err(format!("not yet (last error: {:?})", last_error.borrow())),
                Err(error) => {
                    let observed = format!("{error:#}");
                    *last_error.borrow_mut() = Some(error);
                    Err(observed)
                }
            }
        }
    })
    .await;
    Ok(found?)
}

/// The text of the first element matching `css`, or None. Read in one script call, so a view
/// re-rendering in between cannot leave the test with a stale element.
async fn text(client: &Client, css: &str) -> anyhow::Result<Option<String>> {
    let value = client
        .execute(
            "const el = document.querySelector(arguments[0]); return el ? el.textContent : null;",
            vec![json!(css)],
        )
        .await?;
    Ok(value.as_str().map(|s| s.trim().to_string()))
}

async fn count(client: &Client, css: &str) -> anyhow::Result<usize> {
    let value = client
        .execute(
            "return document.querySelectorAll(arguments[0]).length;",
            vec![json!(css)],
        )
        .await?;
    Ok(value.as_u64().unwrap_or(0) as usize)
}

async fn wait_text(client: &Client, css: &str, expected: &str) -> anyhow::Result<()> {
    wait_for(&format!("{css} to read {expected:?}"), || async {
        Ok(text(client, css)
            .await?
            .filter(|t| t.contains(expected))
            .map(|_| ()))
    })
    .await
}

async fn wait_present(client: &Client, css: &str) -> anyhow::Result<()> {
    wait_for(&format!("{css} to appear"), || async {
        Ok((count(client, css).await? > 0).then_some(()))
    })
    .await
}

/// Clicks the element once it exists and accepts the click (it may be re-rendered meanwhile).
async fn click(client: &Client, css: &str) -> anyhow::Result<()> {
    wait_for(&format!("{css} to be clickable"), || async {
        let element = client.find(Locator::Css(css)).await?;
        element.click().await?;
        Ok(Some(()))
    })
    .await
}

async fn screenshot(client: &Client, name: &str) -> anyhow::Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/screenshots");
    std::fs::create_dir_all(&dir)?;
    let png = client.screenshot().await?;
    std::fs::write(dir.join(format!("{name}.png")), png)?;
    Ok(())
}

/// The dashboard's confirmation dialog is open: press its confirm button.
async fn confirm(client: &Client) -> anyhow::Result<()> {
    wait_present(client, "dialog#confirm[open]").await?;
    click(client, "#confirm-ok").await?;
    wait_for("the dialog to close", || async {
        Ok((count(client, "dialog#confirm[open]").await? == 0).then_some(()))
    })
    .await
}

/// The ids of the job rows shown, in order.
async fn job_rows(client: &Client) -> anyhow::Result<Vec<String>> {
    let value = client
        .execute(
            "return [...document.querySelectorAll('#jobs-table tr[data-job]')]\
               .map((row) => row.dataset.job);",
            vec![],
        )
        .await?;
    Ok(serde_json::from_value(value)?)
}

/// Waits until the job list shows exactly `expected` (in any order).
async fn wait_rows(client: &Client, expected: &[String]) -> anyhow::Result<()> {
    let mut want = expected.to_vec();
    want.sort();
    wait_for(
        &format!("the job list to show exactly {want:?}"),
        || async {
            let mut shown = job_rows(client).await?;
            shown.sort();
            Ok((shown == want).then_some(()))
        },
    )
    .await
}

/// Waits for the dashboard to finish `n` more refreshes: the sidebar's "updated" time moves
/// on with each (so a list that is live has asked the server again in the meantime).
async fn wait_refreshes(client: &Client, n: usize) -> anyhow::Result<()> {
    for _ in 0..n {
        let before = text(client, "#live .live-text").await?;
        wait_for("the dashboard to refresh", || async {
            let now = text(client, "#live .live-text").await?;
            Ok((now != before).then_some(()))
        })
        .await?;
    }
    Ok(())
}

/// The jobs `GET /v1/jobs?{query}` lists, as (id, state).
async fn listed(api: &Api, query: &str) -> anyhow::Result<Vec<(String, String)>> {
    let page = api
        .send(
            reqwest::Method::GET,
            &format!("/v1/jobs?{query}&limit=100"),
            Value::Null,
        )
        .await?;
    let jobs = page["jobs"]
        .as_array()
        .ok_or_else(|| anyhow!("no jobs in {page}"))?;
    Ok(jobs
        .iter()
        .map(|job| {
            (
                job["id"].as_str().unwrap_or_default().to_string(),
                job["state"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect())
}

/// A `viewer` signs in and reads what an admin reads (queues, the history, the Kinds view,
/// schedules, limits) while every button that would change something is disabled with the
/// reason; then signs out.
async fn viewer_reads_and_changes_nothing(client: &Client, api: &Api) -> anyhow::Result<()> {
    let created = api
        .send(
            reqwest::Method::POST,
            "/v1/tokens",
            json!({"role": "viewer", "name": "e2e-viewer"}),
        )
        .await?;
    let secret = created["secret"]
        .as_str()
        .ok_or_else(|| anyhow!("no secret in {created}"))?
        .to_string();
    let input = client.find(Locator::Css("#token")).await?;
    input.send_keys(&secret).await?;
    click(client, "#login-submit").await?;
    wait_text(client, ".user", "viewer").await?;
    click(client, "a[data-nav='overview']").await?;
    wait_present(client, "#view-overview tr[data-queue='mail']").await?;
    let disabled = |css: &'static str| async move {
        let state = client
            .execute(
                "const b = document.querySelector(arguments[0]); \
                 return b ? [b.disabled, b.title] : null;",
                vec![json!(css)],
            )
            .await?;
        ensure!(
            state == json!([true, "Needs the admin role"]),
            "{css} is disabled for a viewer: {state}"
        );
        anyhow::Ok(())
    };
    disabled("tr[data-queue='mail'] button[data-action='pause']").await?;
    wait_for("the history for a viewer", || async {
        let rate = text(client, "#failure-rate").await?;
        Ok(rate.filter(|t| t != "—").map(|_| ()))
    })
    .await?;
    click(client, "a[data-nav='kinds']").await?;
    wait_present(client, "#kinds-table tr[data-kind='push.send']").await?;
    click(client, "a[data-nav='schedules']").await?;
    wait_present(client, "tr[data-schedule='nightly-report']").await?;
    disabled("#schedule-new").await?;
    disabled("tr[data-schedule='nightly-report'] button[data-action='trigger-schedule']").await?;
    screenshot(client, "viewer-schedules").await?;
    click(client, "a[data-nav='limits']").await?;
    wait_text(
        client,
        "#limits-table tr[data-limit='per-customer'] td[data-col='in-use']",
        "1 over 1 key",
    )
    .await?;
    disabled("tr[data-limit='per-customer'] button[data-action='delete-limit']").await?;
    click(client, "#logout").await?;
    wait_present(client, "#token").await?;
    Ok(())
}

/// Schedules managed from the page: a new one from the form (a bad cron first, refused under
/// its box), paused (the row says so, no next run), run now (its job enqueued), resumed.
async fn manage_schedules(client: &Client) -> anyhow::Result<()> {
    click(client, "#schedule-new").await?;
    wait_present(client, "#schedule-form").await?;
    let fill = |css: &'static str, value: &'static str| async move {
        let input = client.find(Locator::Css(css)).await?;
        input.clear().await?;
        input.send_keys(value).await?;
        anyhow::Ok(())
    };
    fill("#sf-name", "e2e-made").await?;
    fill("#sf-cron", "not a cron").await?;
    // A kind the test's worker completes, so the run started by hand adds no dead job.
    fill("#sf-job-kind", "cache.sweep").await?;
    fill("#sf-job-queue", "default").await?;
    fill("#sf-job-payload", r#"{"from": "dashboard"}"#).await?;
    click(client, "#sf-save").await?;
    wait_for("the bad cron refused under its box", || async {
        Ok(text(client, "#sf-cron-error")
            .await?
            .filter(|t| !t.is_empty())
            .map(|_| ()))
    })
    .await?;
    fill("#sf-cron", "0 4 * * *").await?;
    click(client, "#sf-save").await?;
    let row = "tr[data-schedule='e2e-made']";
    wait_present(client, row).await?;
    ensure!(
        count(client, "#schedule-form").await? == 0,
        "the form closes once saved"
    );
    click(
        client,
        &format!("{row} button[data-action='pause-schedule']"),
    )
    .await?;
    wait_present(client, "tr[data-schedule='e2e-made'][data-paused='true']").await?;
    wait_text(client, row, "paused").await?;
    click(
        client,
        &format!("{row} button[data-action='trigger-schedule']"),
    )
    .await?;
    wait_text(client, "#toasts", "Schedule e2e-made run now: job").await?;
    click(
        client,
        &format!("{row} button[data-action='resume-schedule']"),
    )
    .await?;
    wait_present(client, "tr[data-schedule='e2e-made'][data-paused='false']").await?;
    Ok(())
}

/// Search, selection and bulk actions on the job list. Jobs of two tenants wait in `billing`
/// (no worker serves it): the list finds them by tag and by tenant, shows the server's
/// complaint about a bad payload filter next to the field, holds still while a row is selected
/// (until the selection is cleared or Live is pressed), and cancels everything matching the
/// search after a confirmation that counts it — the jobs of the other tenant stay untouched.
async fn search_and_bulk(client: &Client, api: &Api) -> anyhow::Result<()> {
    let invoice = |tenant: &str, n: u32, tags: Value| {
        json!({"kind": "invoice.send", "queue": "billing", "tenant": tenant, "tags": tags,
               "payload": {"invoice": n}})
    };
    let mut acme = Vec::new();
    for n in 0..3 {
        let tags = if n == 0 { json!(["vip"]) } else { json!([]) };
        acme.push(api.enqueue(invoice("acme", n, tags)).await?);
    }
    let mut globex = Vec::new();
    for n in 0..2 {
        globex.push(api.enqueue(invoice("globex", 100 + n, json!([]))).await?);
    }

    // By tag: only the VIP job. By tenant: acme's three, none of globex's.
    click(client, "#filters-clear").await?;
    let tag = client.find(Locator::Css("#filter-tag")).await?;
    tag.send_keys("vip\n").await?;
    wait_rows(client, &acme[..1]).await?;
    tag.clear().await?;
    tag.send_keys("\n").await?;
    client
        .find(Locator::Css("#filter-tenant"))
        .await?
        .send_keys("acme\n")
        .await?;
    wait_rows(client, &acme).await?;
    let url = client.current_url().await?;
    ensure!(
        url.fragment().unwrap_or_default().contains("tenant=acme"),
        "the search is kept in the address: {url}"
    );

    // A payload filter that is not JSON: the server's message shows next to the field.
    let payload = client.find(Locator::Css("#filter-payload")).await?;
    payload.send_keys("{nope\n").await?;
    wait_text(client, "#filter-payload-error", "JSON object").await?;
    payload.clear().await?;
    payload.send_keys("\n").await?;
    wait_for("the payload error to go", || async {
        Ok((text(client, "#filter-payload-error").await?.as_deref() == Some("")).then_some(()))
    })
    .await?;
    wait_rows(client, &acme).await?;

    // A time range: the local time picked becomes an RFC 3339 UTC timestamp in the query.
    let set_before = |value: &str| {
        client.execute(
            "const input = document.querySelector('#filter-created-before'); \
             input.value = arguments[0]; \
             input.dispatchEvent(new Event('change', {bubbles: true})); return true;",
            vec![json!(value)],
        )
    };
    set_before("2000-01-02T03:04").await?;
    wait_text(client, "#jobs-table .empty-title", "No jobs match").await?;
    let url = client.current_url().await?;
    let fragment = url.fragment().unwrap_or_default().to_string();
    ensure!(
        fragment.contains("created_before=2000-01-0") && fragment.contains("%3A04%3A00Z"),
        "created_before is sent as RFC 3339 UTC: {url}"
    );
    set_before("").await?;
    wait_rows(client, &acme).await?;

    // A selected row holds the list still: a new matching job shows only once the selection
    // is cleared.
    let newest = format!("#jobs-table tr[data-job='{}'] input.row-check", acme[2]);
    click(client, &newest).await?;
    wait_text(client, "#jobs-selection", "1 selected").await?;
    wait_text(client, "#jobs-live", "Paused").await?;
    let late = api.enqueue(invoice("acme", 3, json!([]))).await?;
    wait_refreshes(client, 3).await?;
    let mut rows = job_rows(client).await?;
    rows.sort();
    let mut before = acme.clone();
    before.sort();
    ensure!(rows == before, "the paused list changed: {rows:?}");
    click(client, &newest).await?;
    wait_text(client, "#jobs-live", "Live").await?;
    let mut matching = acme.clone();
    matching.push(late);
    wait_rows(client, &matching).await?;

    // ... or once Live is pressed (the selection stays).
    click(client, &newest).await?;
    wait_text(client, "#jobs-live", "Paused").await?;
    let later = api.enqueue(invoice("acme", 4, json!([]))).await?;
    wait_refreshes(client, 3).await?;
    ensure!(
        count(client, &format!("#jobs-table tr[data-job='{later}']")).await? == 0,
        "a paused list shows no new rows"
    );
    click(client, "#jobs-live").await?;
    wait_text(client, "#jobs-live", "Live").await?;
    matching.push(later);
    wait_rows(client, &matching).await?;
    wait_text(client, "#jobs-selection", "1 selected").await?;
    click(client, &newest).await?;
    wait_text(client, "#jobs-selection", "Select jobs").await?;

    // Paused by hand, the list stays paused when a selection comes and goes.
    click(client, "#jobs-live").await?;
    wait_text(client, "#jobs-live", "Paused").await?;
    click(client, &newest).await?;
    wait_text(client, "#jobs-selection", "1 selected").await?;
    click(client, &newest).await?;
    wait_text(client, "#jobs-selection", "Select jobs").await?;
    ensure!(
        text(client, "#jobs-live").await?.as_deref() == Some("Paused"),
        "a list paused by hand stays paused when the selection is cleared"
    );
    click(client, "#jobs-live").await?;
    wait_text(client, "#jobs-live", "Live").await?;

    // Select the page, then everything matching: a job that arrives meanwhile is not on the
    // page but matches, and the confirmation counts it (a dry run of the filter).
    click(client, "#jobs-table thead input.page-check").await?;
    wait_text(client, "#jobs-selection", "5 selected").await?;
    wait_text(client, "#jobs-select-matching", "Select all 5 matching").await?;
    let unseen = api.enqueue(invoice("acme", 5, json!([]))).await?;
    matching.push(unseen.clone());
    click(client, "#jobs-select-matching").await?;
    wait_text(client, "#jobs-selection", "All 6 jobs matching").await?;
    ensure!(
        count(client, &format!("#jobs-table tr[data-job='{unseen}']")).await? == 0,
        "the list stays paused while everything matching is selected"
    );
    click(client, "#jobs-cancel").await?;
    wait_present(client, "dialog#confirm[open]").await?;
    wait_text(client, "#confirm-title", "Cancel 6 jobs?").await?;
    wait_text(client, "#confirm-text", "6 jobs in this search").await?;
    screenshot(client, "bulk-confirm").await?;
    confirm(client).await?;
    wait_text(client, "#toasts", "Cancelled 6 jobs.").await?;
    wait_for("six cancelled rows", || async {
        let rows = count(client, "#jobs-table tr[data-job][data-state='cancelled']").await?;
        Ok((rows == 6 && count(client, "#jobs-table tr[data-job]").await? == 6).then_some(()))
    })
    .await?;
    wait_text(client, "#jobs-live", "Live").await?;

    // Through the API: exactly acme's jobs were cancelled.
    let mut cancelled = listed(api, "tenant=acme").await?;
    cancelled.sort();
    let mut expected: Vec<(String, String)> = matching
        .iter()
        .map(|id| (id.clone(), "cancelled".to_string()))
        .collect();
    expected.sort();
    ensure!(cancelled == expected, "acme's jobs: {cancelled:?}");
    let others = listed(api, "tenant=globex").await?;
    ensure!(
        others.len() == 2 && others.iter().all(|(_, state)| state == "available"),
        "globex's jobs are untouched: {others:?}"
    );
    Ok(())
}

/// A Chrome DevTools Protocol command, sent through chromedriver's `goog/cdp/execute` endpoint.
#[derive(Debug)]
struct Cdp {
    cmd: &'static str,
    params: Value,
}

impl fantoccini::wd::WebDriverCompatibleCommand for Cdp {
    fn endpoint(
        &self,
        base_url: &reqwest::Url,
        session_id: Option<&str>,
    ) -> Result<reqwest::Url, <reqwest::Url as std::str::FromStr>::Err> {
        base_url.join(&format!(
            "session/{}/goog/cdp/execute",
            session_id.unwrap_or_default()
        ))
    }

    fn method_and_body(&self, _: &reqwest::Url) -> (reqwest::Method, Option<String>) {
        let body = json!({"cmd": self.cmd, "params": self.params});
        (reqwest::Method::POST, Some(body.to_string()))
    }
}

/// The colour schemes the dashboard has: its stylesheet follows `prefers-color-scheme`.
const SCHEMES: [&str; 2] = ["light", "dark"];

/// Makes the page's `prefers-color-scheme` query answer `scheme` (DevTools' media emulation,
/// which lasts across navigations in the tab), and checks that the page sees it.
async fn color_scheme(client: &Client, scheme: &str) -> anyhow::Result<()> {
    client
        .issue_cmd(Cdp {
            cmd: "Emulation.setEmulatedMedia",
            params: json!({"features": [{"name": "prefers-color-scheme", "value": scheme}]}),
        })
        .await?;
    let seen = client
        .execute(
            "return matchMedia('(prefers-color-scheme: dark)').matches ? 'dark' : 'light';",
            vec![],
        )
        .await?;
    ensure!(
        seen == json!(scheme),
        "the page sees {seen} instead of {scheme}"
    );
    Ok(())
}

/// axe-core's browser build, from the test's own npm package (`crates/conveyor/tests/a11y`,
/// installed by `scripts/test.sh`).
fn axe_source() -> anyhow::Result<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/a11y");
    let path = dir.join("node_modules/axe-core/axe.min.js");
    std::fs::read_to_string(&path).with_context(|| {
        format!(
            "cannot read {}: run `npm ci --prefix {}` (scripts/test.sh does)",
            path.display(),
            dir.display()
        )
    })
}

/// One state of the dashboard the accessibility check looks at: where it is (a `#/...` route
/// of the dashboard, or empty for the page as it is), what to click first (a form or a dialog
/// to open), what shows that it has its data (every selector matches), and what to click
/// afterwards to close it.
struct Page {
    name: &'static str,
    address: String,
    open: Option<&'static str>,
    ready: Vec<String>,
    close: Option<&'static str>,
}

impl Page {
    fn new(name: &'static str, address: impl Into<String>, ready: &[&str]) -> Self {
        Page {
            name,
            address: address.into(),
            open: None,
            ready: ready.iter().map(|css| css.to_string()).collect(),
            close: None,
        }
    }

    fn opening(mut self, open: &'static str, close: Option<&'static str>) -> Self {
        self.open = Some(open);
        self.close = close;
        self
    }
}

/// Runs axe-core's WCAG 2 A and AA rules over the document (injecting axe first if this
/// document has not got it yet), plus `empty-table-header` (a best practice, not a WCAG rule:
/// a column of buttons needs a name too). The violations of impact serious or critical, and
/// any empty table header, each with the number of elements and one paragraph: rule, impact,
/// what the rule asks, and the first elements' selectors with axe's failure summary.
async fn axe_violations(client: &Client, axe: &str) -> anyhow::Result<Vec<(u64, String)>> {
    let loaded = client
        .execute(
            "return typeof window.axe === 'object' && typeof window.axe.run === 'function';",
            vec![],
        )
        .await?;
    if loaded != json!(true) {
        client
            .execute(&format!("{axe}\n;return typeof window.axe;"), vec![])
            .await
            .context("injecting axe-core")?;
    }
    let found = client
        .execute_async(
            "const done = arguments[arguments.length - 1]; \
             axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa']}, \
                                rules: {'empty-table-header': {enabled: true}}, \
                                resultTypes: ['violations']}) \
               .then((result) => done(result.violations \
                 .filter((v) => v.impact === 'serious' || v.impact === 'critical' \
                   || v.id === 'empty-table-header') \
                 .map((v) => ({id: v.id, impact: v.impact, help: v.help, count: v.nodes.length, \
                   nodes: v.nodes.slice(0, 5).map((n) => ({target: n.target.join(' '), \
                     summary: (n.failureSummary || '').replace(/\\s+/g, ' ').trim()}))})))) \
               .catch((error) => done({error: String(error && error.stack || error)}));",
            vec![],
        )
        .await?;
    if let Some(error) = found.get("error") {
        bail!("axe.run failed: {error}");
    }
    let found = found
        .as_array()
        .ok_or_else(|| anyhow!("axe.run answered {found}"))?;
    Ok(found
        .iter()
        .map(|v| {
            let count = v["count"].as_u64().unwrap_or(0);
            let mut report = format!(
                "{} ({}, {} element(s)): {}",
                v["id"].as_str().unwrap_or("?"),
                v["impact"].as_str().unwrap_or("?"),
                count,
                v["help"].as_str().unwrap_or_default()
            );
            for node in v["nodes"].as_array().into_iter().flatten() {
                report.push_str(&format!(
                    "\n      {} — {}",
                    node["target"].as_str().unwrap_or("?"),
                    node["summary"].as_str().unwrap_or_default()
                ));
            }
            (count, report)
        })
        .collect())
}

/// The accessibility check: each page, in the light and then the dark colour scheme, has no
/// serious or critical violation of axe-core's WCAG 2 A and AA rules (nor an empty table
/// header). Every violation of every page is listed before the check fails. Leaves the page
/// in the light scheme.
async fn accessible(client: &Client, pages: &[Page]) -> anyhow::Result<()> {
    let axe = axe_source()?;
    let mut failures = Vec::new();
    let (mut rules, mut elements) = (0, 0);
    for page in pages {
        if !page.address.is_empty() {
            // Within the same document: the route changes, the session and axe stay.
            client
                .execute(
                    "if (location.hash !== arguments[0]) location.hash = arguments[0]; return true;",
                    vec![json!(page.address)],
                )
                .await?;
        }
        if let Some(open) = page.open {
            click(client, open).await?;
        }
        for css in &page.ready {
            wait_present(client, css)
                .await
                .with_context(|| format!("the {} page for the accessibility check", page.name))?;
        }
        for scheme in SCHEMES {
            color_scheme(client, scheme).await?;
            let found = axe_violations(client, &axe)
                .await
                .with_context(|| format!("axe on the {} page ({scheme})", page.name))?;
            if !found.is_empty() {
                rules += found.len();
                elements += found.iter().map(|(count, _)| count).sum::<u64>();
                let reports: Vec<&str> = found.iter().map(|(_, report)| report.as_str()).collect();
                failures.push(format!(
                    "{} ({}, {scheme}):\n  {}",
                    page.name,
                    if page.address.is_empty() {
                        "as loaded"
                    } else {
                        &page.address
                    },
                    reports.join("\n  ")
                ));
            }
        }
        color_scheme(client, "light").await?;
        if let Some(close) = page.close {
            click(client, close).await?;
        }
    }
    ensure!(
        failures.is_empty(),
        "axe-core: {rules} violations of its WCAG 2 A/AA rules (serious or critical) or of \
         empty-table-header, on {elements} elements:\n{}",
        failures.join("\n")
    );
    Ok(())
}

struct Ids {
    doomed: String,
    legacy: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_end_to_end_in_headless_chromium() {
    let chromium = find_program("CONVEYOR_CHROMIUM", &["chromium", "chromium-browser"]);
    let driver = find_program("CONVEYOR_CHROMEDRIVER", &["chromedriver"]);
    let (Some(chromium), Some(driver)) = (chromium, driver) else {
        panic!(
            "the dashboard test needs chromium and chromedriver: \
             apt-get install -y chromium chromium-driver (as .ci/run does)"
        );
    };

    let dir = temp_dir();
    let store = format!("sqlite://{}", path_in(&dir, "jobs.db").display());
    let auth = auth_supported();
    let token = if auth {
        Some(create_admin_token(&store).expect("admin token"))
    } else {
        None
    };
    let server = start_server(
        &path_in(&dir, "jobs.db"),
        if auth { &["--auth"] } else { &[] },
    );
    let api = Api {
        base: server.url.clone(),
        token: token.clone(),
        http: reqwest::Client::new(),
    };

    // One worker for every queue but `media` (whose jobs therefore wait, and age). `report.build`
    // fails permanently until the marker file exists, `legacy.import` always does.
    let marker = path_in(&dir, "templates-fixed");
    let script = format!(
        "cat >/dev/null; case \"$CONVEYOR_JOB_KIND\" in \
           report.build) [ -f '{}' ] && exit 0; echo 'report template missing' >&2; exit 65;; \
           legacy.import) echo 'legacy format is no longer supported' >&2; exit 65;; \
           sync.flaky) [ \"$CONVEYOR_JOB_ATTEMPT\" -gt 1 ] && exit 0; echo 'upstream timed out' >&2; exit 75;; \
           *) echo '{{\"ok\": true}}';; \
         esac",
        marker.display()
    );
    let mut worker_cmd = Command::new(BIN);
    worker_cmd
        .args(["work", "--server", &server.url, "--exec", &script])
        .args([
            "--queues",
            "mail,reports,default,notifications",
            "--concurrency",
            "2",
        ])
        .env("CONVEYOR_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    if let Some(token) = &token {
        worker_cmd.env("CONVEYOR_TOKEN", token);
    }
    let worker = Group::spawn(&mut worker_cmd).expect("worker");

    let ids = seed(&api).await.expect("seed jobs");

    let port = free_port().expect("free port");
    let profile = path_in(&dir, "chromium-profile");
    let chromedriver = Group::spawn(
        Command::new(&driver)
            .arg(format!("--port={port}"))
            // Chromium's scratch directories go into the test's temp dir, removed with it.
            .env("TMPDIR", dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .expect("chromedriver");
    let webdriver = format!("http://127.0.0.1:{port}");
    let client = connect(&webdriver, &chromium, &profile)
        .await
        .expect("WebDriver session");

    let outcome = drive(&client, &server, &api, token.as_deref(), &marker, &ids).await;
    if outcome.is_err() {
        // Leave the page as it was at the failure next to the test binaries, for debugging.
        if let Ok(png) = client.screenshot().await {
            let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-e2e-failure.png");
            let _ = std::fs::write(&path, png);
            eprintln!("screenshot of the failure: {}", path.display());
        }
    }
    let _ = client.close().await;
    drop(chromedriver);
    drop(worker);
    drop(server);
    drop(dir);
    outcome.expect("dashboard end to end");
}

async fn connect(webdriver: &str, chromium: &Path, profile: &Path) -> anyhow::Result<Client> {
    let capabilities = json!({
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": chromium.display().to_string(),
            "args": [
                "--headless=new",
                // The test may run as root (CI), where Chromium's sandbox cannot start.
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--hide-scrollbars",
                "--force-device-scale-factor=1",
                "--lang=en-US",
                format!("--window-size={},{}", WINDOW.0, WINDOW.1),
                format!("--user-data-dir={}", profile.display()),
            ],
        },
    });
    let Value::Object(capabilities) = capabilities else {
        bail!("capabilities must be an object");
    };
    let mut builder = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new());
    builder.capabilities(capabilities);
    // chromedriver needs a moment to listen; the first successful session is the signal.
    let client = wait_for("chromedriver to start a session", || async {
        match builder.connect(webdriver).await {
            Ok(client) => Ok(Some(client)),
            Err(error) => Err(anyhow!("{error}")),
        }
    })
    .await?;
    resize(&client, WINDOW).await?;
    Ok(client)
}

/// Sizes the page (not the window: `--window-size` and `set_window_size` size the window, so
/// grow it by the difference) to exactly `size`, which every screenshot then has.
async fn resize(client: &Client, size: (u32, u32)) -> anyhow::Result<()> {
    let inner = client
        .execute("return [window.innerWidth, window.innerHeight];", vec![])
        .await?;
    let (width, height) = client.get_window_size().await?;
    let dx = width.saturating_sub(inner[0].as_u64().unwrap_or(width));
    let dy = height.saturating_sub(inner[1].as_u64().unwrap_or(height));
    client
        .set_window_size(size.0 + dx as u32, size.1 + dy as u32)
        .await?;
    wait_for("the page to take its new size", || async {
        let inner = client.execute("return window.innerWidth;", vec![]).await?;
        Ok((inner.as_u64() == Some(u64::from(size.0))).then_some(()))
    })
    .await
}

/// Whether the page is no wider than the window (nothing sticks out to the right).
async fn fits_width(client: &Client) -> anyhow::Result<Value> {
    Ok(client
        .execute(
            "const w = window.innerWidth; \
             const wide = [...document.querySelectorAll('body *')] \
               .filter((e) => e.getBoundingClientRect().right > w + 1 && !e.closest('.table-wrap, .flow-graph-wrap')) \
               .slice(0, 3).map((e) => e.tagName + '#' + e.id + '.' + e.className); \
             return document.documentElement.scrollWidth <= w ? true \
               : {scrollWidth: document.documentElement.scrollWidth, width: w, wide};",
            vec![],
        )
        .await?)
}

/// The phone layout (390 x 844): the sidebar waits behind the menu button and nothing pushes
/// the page wider than the screen on the overview and the jobs list.
async fn mobile_layout(client: &Client) -> anyhow::Result<()> {
    const PHONE: (u32, u32) = (390, 844);
    resize(client, PHONE).await?;
    let sidebar_shown = "const s = document.getElementById('sidebar'); \
                         return Boolean(s) && getComputedStyle(s).display !== 'none';";
    wait_present(client, "#view-overview tr[data-queue='mail']").await?;
    ensure!(
        client.execute(sidebar_shown, vec![]).await? == json!(false),
        "the sidebar is hidden on a phone"
    );
    let expanded = "return document.getElementById('menu-toggle').getAttribute('aria-expanded');";
    ensure!(
        client.execute(expanded, vec![]).await? == json!("false"),
        "the menu starts closed"
    );
    let fits = fits_width(client).await?;
    ensure!(fits == json!(true), "the overview fits 390 px: {fits}");
    screenshot(client, "mobile-overview").await?;

    click(client, "#menu-toggle").await?;
    ensure!(
        client.execute(expanded, vec![]).await? == json!("true"),
        "the menu button says it is open"
    );
    ensure!(
        client.execute(sidebar_shown, vec![]).await? == json!(true),
        "the menu button shows the sidebar"
    );
    click(client, "a[data-nav='jobs']").await?;
    wait_present(client, "#view-jobs #jobs-table tr[data-job]").await?;
    ensure!(
        client.execute(sidebar_shown, vec![]).await? == json!(false),
        "choosing a page closes the menu"
    );
    let fits = fits_width(client).await?;
    ensure!(fits == json!(true), "the jobs page fits 390 px: {fits}");

    click(client, "#menu-toggle").await?;
    click(client, "a[data-nav='overview']").await?;
    wait_present(client, "#view-overview tr[data-queue='mail']").await?;
    resize(client, WINDOW).await?;
    ensure!(
        client.execute(sidebar_shown, vec![]).await? == json!(true),
        "the sidebar is back on a laptop"
    );
    Ok(())
}

/// Queue settings from the overview: a refused value is shown next to its field, a good one
/// is saved through `PUT /v1/queues/{name}` and reads back from the API.
async fn queue_settings(client: &Client, api: &Api) -> anyhow::Result<()> {
    click(
        client,
        "tr[data-queue='media'] button[data-action='settings']",
    )
    .await?;
    wait_text(client, "#qs-queue", "media").await?;
    wait_present(client, "#qs-concurrency_limit").await?;
    let weight = client.find(Locator::Css("#qs-weight")).await?;
    weight.clear().await?;
    weight.send_keys("0").await?;
    click(client, "#qs-save").await?;
    wait_for("the refused weight explained next to its field", || async {
        Ok(text(client, "#qs-weight-error")
            .await?
            .filter(|t| !t.trim().is_empty())
            .map(|_| ()))
    })
    .await?;
    ensure!(
        count(client, "#qs-weight[aria-invalid='true']").await? == 1,
        "the refused field is marked"
    );
    let weight = client.find(Locator::Css("#qs-weight")).await?;
    weight.clear().await?;
    let limit = client.find(Locator::Css("#qs-concurrency_limit")).await?;
    limit.clear().await?;
    limit.send_keys("3").await?;
    click(client, "#qs-save").await?;
    wait_for("the concurrency limit saved", || async {
        let settings = api
            .send(reqwest::Method::GET, "/v1/queues/media", Value::Null)
            .await?;
        Ok(
            (settings["concurrency_limit"] == json!(3) && settings["weight"].is_null())
                .then_some(()),
        )
    })
    .await?;
    wait_present(client, "#qs-concurrency_limit").await?;
    ensure!(
        text(client, "#qs-weight-error")
            .await?
            .unwrap_or_default()
            .is_empty(),
        "the error is gone once saved"
    );
    click(client, "#qs-close").await?;
    Ok(())
}

/// Jobs in several queues and states, and two schedules, so every page has something to show.
async fn seed(api: &Api) -> anyhow::Result<Ids> {
    for n in 0..12 {
        api.enqueue(json!({"kind": "email.send", "queue": "mail",
                           "payload": {"to": format!("user{n}@example.com"), "template": "welcome"}}))
            .await?;
    }
    let doomed = api
        .enqueue(json!({"kind": "report.build", "queue": "reports",
                        "payload": {"month": "2026-11", "format": "pdf"}, "max_attempts": 3}))
        .await?;
    let mut legacy = Vec::new();
    for n in 0..2 {
        legacy.push(
            api.enqueue(json!({"kind": "legacy.import", "queue": "reports", "payload": {"file": format!("batch-{n}.csv")}}))
                .await?,
        );
    }
    for n in 0..4 {
        api.enqueue(json!({"kind": "image.resize", "queue": "media", "payload": {"image": n}}))
            .await?;
    }
    api.enqueue(json!({"kind": "digest.send", "queue": "mail", "delay_ms": 3_600_000}))
        .await?;
    // Handled in batches (the Kinds view says how); its one job is not due for an hour.
    api.send(
        reqwest::Method::PUT,
        "/v1/kinds/digest.send",
        json!({"batch": {"max_size": 50, "max_wait_ms": 2000, "key": "tenant"}}),
    )
    .await?;
    api.send(
        reqwest::Method::PUT,
        "/v1/schedules/nightly-report",
        json!({"cron": "0 3 * * *", "timezone": "Europe/Berlin",
               "job": {"kind": "report.build", "queue": "reports"}, "missed": "catch_up", "max_catch_up": 3}),
    )
    .await?;
    api.send(
        reqwest::Method::PUT,
        "/v1/schedules/cache-sweep",
        json!({"cron": "*/5 * * * * *", "job": {"kind": "cache.sweep", "queue": "default"}}),
    )
    .await?;
    // A flow waiting for an approval: no job exists until the signal, so the counts above stay.
    api.send(
        reqwest::Method::POST,
        "/v1/flows",
        json!({"name": "order-1042", "steps": [
            {"name": "approve", "wait": {"signal": "approved"}},
            {"name": "reserve", "job": {"kind": "stock.reserve", "queue": "orders"}, "after": ["approve"]},
            {"name": "charge", "job": {"kind": "card.charge", "queue": "orders"}, "after": ["approve"]},
            {"name": "ship", "job": {"kind": "parcel.ship", "queue": "orders"}, "after": ["reserve", "charge"]}
        ]}),
    )
    .await?;
    Ok(Ids { doomed, legacy })
}

async fn drive(
    client: &Client,
    server: &Server,
    api: &Api,
    token: Option<&str>,
    marker: &Path,
    ids: &Ids,
) -> anyhow::Result<()> {
    // The page itself: served with a strict CSP and no token needed.
    let page = reqwest::get(format!("{}/", server.url)).await?;
    ensure!(
        page.status().is_success(),
        "GET / answered {}",
        page.status()
    );
    let csp = page
        .headers()
        .get("content-security-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    ensure!(csp.contains("default-src 'self'"), "CSP: {csp:?}");

    client.goto(&format!("{}/", server.url)).await?;

    // Sign in: a wrong token is refused inline, the right one opens the overview.
    if let Some(token) = token {
        wait_present(client, "#token").await?;
        screenshot(client, "login").await?;
        accessible(client, &[Page::new("sign-in", "", &["#token"])]).await?;
        let input = client.find(Locator::Css("#token")).await?;
        input.send_keys("cv_not_a_real_token").await?;
        click(client, "#login-submit").await?;
        wait_text(client, "#login-error", "not accepted").await?;
        let input = client.find(Locator::Css("#token")).await?;
        input.clear().await?;
        input.send_keys(token).await?;
        click(client, "#login-submit").await?;
    }
    wait_present(client, "#view-overview").await?;
    ensure!(
        count(client, "#token").await? == 0,
        "no login step without a token"
    );
    wait_text(
        client,
        "#breakers-table .empty-title",
        "No circuit breakers",
    )
    .await?;

    // Live counts: the worker completes the mail jobs and kills the reports.
    wait_text(
        client,
        "tr[data-queue='mail'] td[data-state='completed']",
        "12",
    )
    .await?;
    wait_text(
        client,
        "tr[data-queue='reports'] td[data-state='dead']",
        "3",
    )
    .await?;
    wait_text(
        client,
        "tr[data-queue='media'] td[data-state='available']",
        "4",
    )
    .await?;
    wait_text(
        client,
        "tr[data-queue='mail'] td[data-state='scheduled']",
        "1",
    )
    .await?;
    // Traffic while the page watches, so the charts have something to draw: a steady trickle
    // into `notifications`, every fifth job failing its first attempt and retrying. Bounded:
    // 80 jobs over about 8 seconds.
    let producer = api.clone();
    let trickle = tokio::spawn(async move {
        for n in 0..80 {
            let kind = if n % 5 == 0 {
                "sync.flaky"
            } else {
                "push.send"
            };
            producer
                .enqueue(json!({"kind": kind, "queue": "notifications", "payload": {"n": n}}))
                .await?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        anyhow::Ok(())
    });
    trickle.await??;
    // The charts draw the server's history (the last hour by default, from the first load):
    // the completions and the flaky kind's failures show in it.
    wait_present(
        client,
        "#overview-range button[data-range='1h'][aria-pressed='true']",
    )
    .await?;
    wait_for("the history charts to show the traffic", || async {
        let drawn = client
            .execute(
                "const sum = (id) => Number((document.querySelector(id + ' .chart') || \
                   {dataset: {}}).dataset.sum || 0); \
                 const rate = parseFloat((document.querySelector('#failure-rate') || {}).textContent); \
                 const p95 = (document.querySelector('#run-time-p95') || {}).textContent; \
                 return sum('#chart-throughput') > 0 && sum('#chart-failures') > 0 \
                   && rate > 0 && Boolean(p95) && p95 !== '—';",
                vec![],
            )
            .await?;
        Ok((drawn == json!(true)).then_some(()))
    })
    .await?;
    // "Live" draws per-second rates from what this page has watched.
    click(client, "#overview-range button[data-range='live']").await?;
    wait_for("the live chart to have points", || async {
        let drawn = client
            .execute(
                "const chart = document.querySelector('#chart-throughput .chart'); \
                 return Boolean(chart) && Number(chart.dataset.points) >= 8;",
                vec![],
            )
            .await?;
        Ok((drawn == json!(true)).then_some(()))
    })
    .await?;
    click(client, "#overview-range button[data-range='24h']").await?;
    wait_present(
        client,
        "#overview-range button[data-range='24h'][aria-pressed='true']",
    )
    .await?;
    wait_for("the 24 h history", || async {
        Ok(text(client, "#chart-throughput .chart-x span")
            .await?
            .filter(|t| t == "24 h ago")
            .map(|_| ()))
    })
    .await?;
    click(client, "#overview-range button[data-range='1h']").await?;
    wait_present(
        client,
        "#overview-range button[data-range='1h'][aria-pressed='true']",
    )
    .await?;
    ensure!(
        text(client, "#overview-cards [data-state='dead'] .card-value")
            .await?
            .as_deref()
            == Some("3"),
        "the dead card counts the three dead jobs"
    );
    screenshot(client, "overview").await?;
    mobile_layout(client).await?;

    // Kinds: each kind's throughput, failure rate, run time and wait from the history.
    click(client, "a[data-nav='kinds']").await?;
    wait_present(client, "#view-kinds").await?;
    wait_for("the flaky kind's failures in the Kinds view", || async {
        let rate = text(
            client,
            "#kinds-table tr[data-kind='sync.flaky'] td[data-col='failure-rate']",
        )
        .await?;
        Ok(rate
            .filter(|t| t.ends_with('%') && !t.starts_with("0 "))
            .map(|_| ()))
    })
    .await?;
    let p95 = text(
        client,
        "#kinds-table tr[data-kind='push.send'] td[data-col='run-p95']",
    )
    .await?;
    ensure!(
        p95.as_deref().is_some_and(|t| t != "—"),
        "push.send shows its run time p95 (got {p95:?})"
    );
    let batch = text(
        client,
        "#kinds-table tr[data-kind='digest.send'] td[data-col='batch']",
    )
    .await?;
    ensure!(
        batch.as_deref() == Some("≤ 50 · 2.0 s · tenant"),
        "digest.send shows its batch setting (got {batch:?})"
    );
    screenshot(client, "kinds").await?;

    // Workers and schedules (before any action, so no notice covers the screenshots).
    click(client, "a[data-nav='workers']").await?;
    wait_present(client, "#view-workers").await?;
    // The registry lists workers that report themselves (or says the server has none, or
    // that it does not keep a registry); the leases always show who runs what.
    wait_for("the worker registry shown", || async {
        let shown = count(client, "#workers-registry table, #workers-registry .empty").await?;
        Ok((shown > 0).then_some(()))
    })
    .await?;
    wait_present(client, "#workers-leases table, #workers-leases .empty").await?;
    screenshot(client, "workers").await?;
    // Quiet the worker from the page, then resume it (it still has jobs to do below).
    click(client, "#workers-table button[data-action='worker-quiet']").await?;
    wait_text(client, "#toasts", "told to quiet").await?;
    wait_present(client, "#workers-table button[data-action='worker-resume']").await?;
    wait_text(client, "#workers-table", "quiet").await?;
    click(client, "#workers-table button[data-action='worker-resume']").await?;
    wait_text(client, "#toasts", "resumed: it gets jobs again").await?;
    wait_present(client, "#workers-table button[data-action='worker-quiet']").await?;

    click(client, "a[data-nav='schedules']").await?;
    wait_present(client, "tr[data-schedule='nightly-report']").await?;
    wait_for("the sweep schedule's first run", || async {
        Ok(text(client, "tr[data-schedule='cache-sweep']")
            .await?
            .filter(|t| t.contains("enqueued"))
            .map(|_| ()))
    })
    .await?;
    screenshot(client, "schedules").await?;
    manage_schedules(client).await?;
    manage_sources(client, api).await?;

    // Flows: the list, then one flow drawn as its graph, each step with its state.
    click(client, "a[data-nav='flows']").await?;
    wait_present(client, "#view-flows tr[data-flow]").await?;
    click(client, "#view-flows tr[data-flow] a").await?;
    wait_present(client, "#flow-graph g[data-step='ship']").await?;
    anyhow::ensure!(
        count(client, "#flow-graph .flow-node").await? == 4,
        "every step is drawn"
    );
    anyhow::ensure!(
        count(
            client,
            "#flow-graph g[data-step='approve'][data-state='waiting']"
        )
        .await?
            == 1,
        "the wait step shows that it waits"
    );
    anyhow::ensure!(
        count(client, "#flow-graph .flow-edge").await? == 4,
        "one edge per dependency"
    );
    screenshot(client, "flow").await?;
    let flow_page = format!(
        "#{}",
        client.current_url().await?.fragment().unwrap_or_default()
    );

    // Job list: everything, then filtered by queue and state, then by a kind nothing has.
    click(client, "a[data-nav='jobs']").await?;
    wait_present(client, "#view-jobs #jobs-table tr[data-job]").await?;
    screenshot(client, "jobs").await?;
    client
        .find(Locator::Css("#filter-queue"))
        .await?
        .select_by_value("mail")
        .await?;
    client
        .find(Locator::Css("#filter-state"))
        .await?
        .select_by_value("completed")
        .await?;
    wait_for("12 completed mail jobs listed", || async {
        let rows = count(client, "#jobs-table tr[data-job]").await?;
        let completed = count(client, "#jobs-table tr[data-job][data-state='completed']").await?;
        Ok((rows == 12 && completed == 12).then_some(()))
    })
    .await?;
    let url = client.current_url().await?;
    ensure!(
        url.fragment().unwrap_or_default().contains("queue=mail"),
        "filters are kept in the address: {url}"
    );
    let kind = client.find(Locator::Css("#filter-kind")).await?;
    kind.send_keys("no.such.kind\n").await?;
    wait_text(client, "#jobs-table .empty-title", "No jobs match").await?;

    search_and_bulk(client, api).await?;

    // Dead letters: the three dead jobs with their last errors.
    click(client, "a[data-nav='dead']").await?;
    let doomed_row = format!("#dead-table tr[data-job='{}']", ids.doomed);
    wait_text(
        client,
        &format!("{doomed_row} .last-error"),
        "report template missing",
    )
    .await?;
    wait_for("three dead jobs listed", || async {
        Ok((count(client, "#dead-table tr[data-job]").await? == 3).then_some(()))
    })
    .await?;
    screenshot(client, "dead-letters").await?;

    let held = limits_page(client, api).await?;

    // Accessibility: every view, with its data, passes axe-core's WCAG 2 A/AA rules in both
    // colour schemes (ending on the dead letters, where the test goes on).
    let doomed_page = format!("#/jobs/{}", ids.doomed);
    let held_page = format!("#/jobs/{held}");
    let pages = [
        Page::new(
            "overview",
            "#/",
            &[
                "#view-overview tr[data-queue='mail']",
                "#chart-throughput .chart",
                "#chart-failures .chart",
            ],
        ),
        Page::new("queue settings", "#/", &["#qs-concurrency_limit"]).opening(
            "tr[data-queue='media'] button[data-action='settings']",
            Some("#qs-close"),
        ),
        Page::new("jobs", "#/jobs", &["#view-jobs #jobs-table tr[data-job]"]),
        Page::new(
            "job detail",
            doomed_page.as_str(),
            &["#job-attempts .timeline-item", "#job-payload"],
        ),
        Page::new(
            "confirmation dialog",
            doomed_page.as_str(),
            &["dialog#confirm[open]"],
        )
        .opening("#job-replay", Some("#confirm-cancel")),
        Page::new(
            "kinds",
            "#/kinds",
            &["#kinds-table tr[data-kind='push.send']"],
        ),
        Page::new("workers", "#/workers", &["#workers-table"]),
        Page::new(
            "schedules",
            "#/schedules",
            &["tr[data-schedule='nightly-report']"],
        ),
        Page::new("schedule form", "#/schedules", &["#schedule-form"])
            .opening("#schedule-new", None),
        Page::new("flows", "#/flows", &["#view-flows tr[data-flow]"]),
        Page::new(
            "sources",
            "#/sources",
            &["#sources-table tr[data-source='orders']"],
        ),
        Page::new(
            "limits",
            "#/limits",
            &[
                "#limits-table tr[data-limit='per-customer']",
                "#limits-table tr[data-limit='vendor-api'] .usage-text",
            ],
        ),
        Page::new(
            "limit",
            "#/limits/per-customer",
            &["#limit-keys tr[data-key='acme']"],
        ),
        Page::new(
            "held-back job",
            held_page.as_str(),
            &["#job-blocked", "#job-limits"],
        ),
        Page::new("queue settings with limits", "#/", &["#qs-limits a"]).opening(
            "tr[data-queue='sync'] button[data-action='settings']",
            Some("#qs-close"),
        ),
        Page::new(
            "flow",
            flow_page.as_str(),
            &["#flow-graph g[data-step='ship']"],
        ),
        Page::new("dead letters", "#/dead", &["#dead-table tr[data-job]"]),
    ];
    accessible(client, &pages).await?;

    // The dead job's page: payload and error history.
    click(client, &format!("{doomed_row} a")).await?;
    let view = format!("#view-job[data-job='{}']", ids.doomed);
    wait_present(client, &view).await?;
    wait_text(client, "#job-state", "dead").await?;
    wait_text(client, "#job-payload", "2026-11").await?;
    wait_text(client, "#job-attempts", "report template missing").await?;
    wait_text(client, "#job-attempts", "permanent").await?;
    // Each attempt says where it ran and for how long; the job comes as commands to copy.
    wait_text(client, "#job-attempts .attempt-where", "started").await?;
    // The worker's host, from the registry entry of the worker id the attempt recorded.
    wait_text(client, "#job-attempts .attempt-where", "host ").await?;
    wait_text(
        client,
        ".shell-commands",
        &format!("conveyor job show {}", ids.doomed),
    )
    .await?;
    wait_text(client, ".shell-commands", "curl -s -X POST").await?;
    screenshot(client, "job-detail").await?;

    // Fix the cause, replay from the page, and watch the job complete, with no reload: a
    // marker set on this document must still be there at the end.
    client
        .execute(
            "window.__conveyorE2e = 'same document'; return true;",
            vec![],
        )
        .await?;
    std::fs::write(marker, b"fixed")?;
    click(client, "#job-replay").await?;
    confirm(client).await?;
    wait_text(client, "#job-state", "completed").await?;
    wait_text(client, "#job-attempts .timeline-ok", "completed").await?;
    // The history marks the replay: the failure before it, then run 2 from attempt 1.
    wait_text(
        client,
        "#job-attempts .timeline-replay",
        "Replayed: run 2 starts",
    )
    .await?;
    wait_text(client, "#job-attempts .timeline-ok", "Run 2 · attempt 1").await?;
    screenshot(client, "job-replayed").await?;
    let same = client
        .execute("return window.__conveyorE2e || null;", vec![])
        .await?;
    ensure!(
        same == json!("same document"),
        "the page reloaded during the replay"
    );

    // Bulk discard of the two jobs still dead, behind the confirmation dialog.
    click(client, "a[data-nav='dead']").await?;
    wait_for("the two legacy jobs listed", || async {
        let mut all = true;
        for id in &ids.legacy {
            all &= count(client, &format!("#dead-table tr[data-job='{id}']")).await? == 1;
        }
        Ok((all && count(client, "#dead-table tr[data-job]").await? == 2).then_some(()))
    })
    .await?;
    click(client, "#dead-table thead input[type='checkbox']").await?;
    wait_text(client, "#dead-selection", "2 selected").await?;
    // A selection holds the dead-letter list still, too.
    wait_text(client, "#dead-live", "Paused").await?;
    click(client, "#dead-discard-selected").await?;
    confirm(client).await?;
    wait_text(
        client,
        "#dead-table .empty-title",
        "dead-letter queue is empty",
    )
    .await?;
    wait_text(client, "#dead-live", "Live").await?;

    // Pause and resume a queue from the overview's table.
    click(client, "a[data-nav='overview']").await?;
    click(client, "tr[data-queue='media'] button[data-action='pause']").await?;
    wait_text(client, "tr[data-queue='media'] .badge", "paused").await?;
    click(
        client,
        "tr[data-queue='media'] button[data-action='resume']",
    )
    .await?;
    wait_text(client, "tr[data-queue='media'] .badge", "active").await?;

    // Circuit breakers: one configured on `media` and opened through the API shows on the
    // queue's row and in the breakers panel; the panel closes it and opens it again.
    api.send(
        reqwest::Method::PUT,
        "/v1/queues/media",
        json!({"circuit_breaker": {"failure_ratio": 0.5, "min_calls": 5, "window_ms": 60_000, "open_ms": 30_000}}),
    )
    .await?;
    api.send(
        reqwest::Method::POST,
        "/v1/queues/media/circuit/open",
        json!({"reason": "vendor outage"}),
    )
    .await?;
    let media_breaker = "#breakers-table tr[data-breaker='queue:media']";
    wait_text(
        client,
        "tr[data-queue='media'] .badge[data-breaker='open']",
        "circuit open",
    )
    .await?;
    wait_text(
        client,
        "tr[data-queue='media'] .breaker-note",
        "until closed · vendor outage",
    )
    .await?;
    wait_text(
        client,
        &format!("{media_breaker}[data-state='open']"),
        "vendor outage",
    )
    .await?;
    ensure!(
        text(client, &format!("{media_breaker} .badge"))
            .await?
            .as_deref()
            == Some("circuit open"),
        "the panel's row shows the open state"
    );
    click(
        client,
        &format!("{media_breaker} button[data-action='circuit-close']"),
    )
    .await?;
    confirm(client).await?;
    wait_present(client, &format!("{media_breaker}[data-state='closed']")).await?;
    wait_text(
        client,
        "tr[data-queue='media'] .badge[data-breaker='closed']",
        "breaker",
    )
    .await?;
    click(
        client,
        &format!("{media_breaker} button[data-action='circuit-open']"),
    )
    .await?;
    confirm(client).await?;
    wait_text(
        client,
        &format!("{media_breaker}[data-state='open']"),
        "opened from the dashboard",
    )
    .await?;
    let breakers = api
        .send(reqwest::Method::GET, "/v1/breakers", Value::Null)
        .await?;
    ensure!(
        breakers["breakers"].as_array().is_some_and(|all| all
            .iter()
            .any(|b| b["name"] == "media" && b["state"] == "open" && b["manual"] == true)),
        "the dashboard opened the breaker: {breakers}"
    );

    queue_settings(client, api).await?;

    // Deleting a schedule, behind the confirmation dialog.
    click(client, "a[data-nav='schedules']").await?;
    click(
        client,
        "tr[data-schedule='cache-sweep'] button[data-action='delete-schedule']",
    )
    .await?;
    confirm(client).await?;
    wait_for("the sweep schedule gone", || async {
        Ok(
            (count(client, "tr[data-schedule='cache-sweep']").await? == 0
                && count(client, "tr[data-schedule='nightly-report']").await? == 1)
                .then_some(()),
        )
    })
    .await?;
    let schedules = api
        .send(reqwest::Method::GET, "/v1/schedules", Value::Null)
        .await?;
    ensure!(
        !schedules.to_string().contains("cache-sweep"),
        "the schedule is deleted: {schedules}"
    );

    let violations = client
        .execute(
            "return document.documentElement.dataset.cspViolations || '0';",
            vec![],
        )
        .await?;
    ensure!(
        violations == json!("0"),
        "Content-Security-Policy violations: {violations}"
    );

    // Signing out returns to the sign-in page.
    if token.is_some() {
        click(client, "#logout").await?;
        wait_present(client, "#token").await?;
        viewer_reads_and_changes_nothing(client, api).await?;
    }

    // The API reference renders every operation of /openapi.json (no sign-in needed).
    client.goto(&format!("{}/docs", server.url)).await?;
    wait_present(client, "section.api-op#fetchJobs").await?;
    let operations = count(client, "section.api-op").await?;
    ensure!(operations > 40, "{operations} operations on /docs");
    wait_text(client, "#api-version", "API version").await?;
    accessible(
        client,
        &[Page::new(
            "API reference",
            "",
            &["section.api-op#fetchJobs"],
        )],
    )
    .await?;
    Ok(())
}

/// The Sources page: a stored source (a Redis stream of this run's own, set paused) is listed
/// with its state; Resume starts it reading (the server connects and makes the group), Pause
/// stops it again. The stream is deleted at the end.
async fn manage_sources(client: &Client, api: &Api) -> anyhow::Result<()> {
    let stream = format!(
        "conveyor-e2e-{}-{}",
        std::process::id(),
        chrono::Utc::now().timestamp_micros()
    );
    api.send(
        reqwest::Method::PUT,
        "/v1/sources/orders",
        json!({"type": "redis_stream", "url": "redis://127.0.0.1:6379", "stream": stream,
               "group": "conveyor", "job": {"kind": "order.placed", "queue": "orders"},
               "paused": true}),
    )
    .await?;
    let result = async {
        click(client, "a[data-nav='sources']").await?;
        wait_present(
            client,
            "#sources-table tr[data-source='orders'][data-state='paused']",
        )
        .await?;
        wait_text(client, "#sources-table tr[data-source='orders']", &stream).await?;
        click(client, "#sources-table button[data-action='resume-source']").await?;
        wait_text(client, "#toasts", "Source orders resumed").await?;
        wait_present(
            client,
            "#sources-table tr[data-source='orders'][data-state='running']",
        )
        .await?;
        screenshot(client, "sources").await?;
        click(client, "#sources-table button[data-action='pause-source']").await?;
        wait_text(client, "#toasts", "Source orders paused").await?;
        wait_present(
            client,
            "#sources-table tr[data-source='orders'][data-state='paused']",
        )
        .await
    }
    .await;
    if let Ok(redis) = redis::Client::open("redis://127.0.0.1:6379") {
        if let Ok(mut connection) = redis.get_connection() {
            let _: redis::RedisResult<i64> = redis::Commands::del(&mut connection, &stream);
        }
    }
    result
}

/// Named limits: `per-customer` (one running job per customer, the key read from the payload)
/// and `vendor-api` (100 at once, 600 starts a minute, one budget) are defined through the API
/// and named by the `sync` queue, which no worker serves. Of two jobs of one customer the test
/// takes one as a worker would (`POST /v1/fetch`), so the customer's key is full and the other
/// job is held back. The Limits page lists both limits with their rules and what they use; a
/// limit's page shows the key's running jobs against its bound (and the other limit its recent
/// starts against its rate); the held-back job says which limit and key hold it and how full
/// that key is; the queue's settings name its limits; deleting a limit the queue still names
/// is refused with the server's reason. Returns the held-back job's id.
async fn limits_page(client: &Client, api: &Api) -> anyhow::Result<String> {
    api.send(
        reqwest::Method::PUT,
        "/v1/limits/per-customer",
        json!({"concurrency": 1, "key": "payload.customer"}),
    )
    .await?;
    api.send(
        reqwest::Method::PUT,
        "/v1/limits/vendor-api",
        json!({"concurrency": 100, "rate": {"count": 600, "period_ms": 60_000}}),
    )
    .await?;
    api.send(
        reqwest::Method::PUT,
        "/v1/queues/sync",
        json!({"limits": ["per-customer", "vendor-api"]}),
    )
    .await?;
    let mut ids = Vec::new();
    for n in 0..2 {
        let job = api
            .send(
                reqwest::Method::POST,
                "/v1/jobs",
                json!({"kind": "crm.sync", "queue": "sync", "payload": {"customer": "acme", "page": n}}),
            )
            .await?;
        // This server stamps its next enqueue with the limits just named (the docs' "within a
        // second" is for the other servers of a cluster).
        ensure!(
            job["limit_keys"] == json!(["per-customer:acme", "vendor-api:"]),
            "the job is stamped with the queue's limits: {job}"
        );
        ids.push(
            job["id"]
                .as_str()
                .ok_or_else(|| anyhow!("no id in {job}"))?
                .to_string(),
        );
    }
    // A worker of our own takes what the limits let it: one of acme's two jobs. Its lease
    // outlasts the rest of the test.
    let fetched = api
        .send(
            reqwest::Method::POST,
            "/v1/fetch",
            json!({"worker_id": "e2e-limits", "queues": ["sync"], "max": 2, "lease_ms": 1_800_000}),
        )
        .await?;
    let running: Vec<&str> = fetched["jobs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|job| job["id"].as_str())
        .collect();
    ensure!(
        running.len() == 1,
        "the per-customer limit lets one of acme's jobs run: {fetched}"
    );
    let held = ids
        .iter()
        .find(|id| id.as_str() != running[0])
        .ok_or_else(|| anyhow!("the fetched job {} is not one of {ids:?}", running[0]))?
        .clone();

    // The list: each limit's rule and what it uses now.
    click(client, "a[data-nav='limits']").await?;
    let customer_row = "#limits-table tr[data-limit='per-customer']";
    let vendor_row = "#limits-table tr[data-limit='vendor-api']";
    wait_present(client, customer_row).await?;
    wait_text(
        client,
        &format!("{customer_row} td[data-col='key']"),
        "payload.customer",
    )
    .await?;
    wait_text(
        client,
        &format!("{customer_row} td[data-col='concurrency']"),
        "1",
    )
    .await?;
    wait_text(
        client,
        &format!("{customer_row} td[data-col='in-use']"),
        "1 over 1 key",
    )
    .await?;
    wait_text(client, &format!("{customer_row} td[data-col='full']"), "1").await?;
    wait_text(
        client,
        &format!("{vendor_row} td[data-col='rate']"),
        "600 per 1 m",
    )
    .await?;
    wait_text(
        client,
        &format!("{vendor_row} td[data-col='in-use']"),
        "1 / 100",
    )
    .await?;
    screenshot(client, "limits").await?;

    // Deleting a limit the queue still names: refused, and the page says why.
    click(
        client,
        &format!("{customer_row} button[data-action='delete-limit']"),
    )
    .await?;
    confirm(client).await?;
    wait_text(client, "#limits-action-error", "still named by queue").await?;
    ensure!(
        count(client, customer_row).await? == 1,
        "the refused limit is still listed"
    );

    // One limit's page: the customer's key, full.
    click(client, &format!("{customer_row} a")).await?;
    wait_present(client, "#view-limit[data-limit='per-customer']").await?;
    wait_text(
        client,
        "#limit-rule",
        "at most 1 running at once, per payload.customer",
    )
    .await?;
    let acme = "#limit-keys tr[data-key='acme']";
    wait_text(client, &format!("{acme} td[data-col='running']"), "1 / 1").await?;
    ensure!(
        count(client, &format!("{acme}[data-full='true']")).await? == 1,
        "the key at its bound is marked full"
    );
    wait_text(client, "#limit-in-use", "1 over 1 key · 1 full").await?;
    screenshot(client, "limit").await?;
    // A limit without a key has one budget: its running jobs and starts in the last minute.
    client
        .execute(
            "location.hash = '#/limits/vendor-api'; return true;",
            vec![],
        )
        .await?;
    wait_present(client, "#view-limit[data-limit='vendor-api']").await?;
    let budget = "#limit-keys tr[data-key='']";
    wait_text(
        client,
        &format!("{budget} td[data-col='running']"),
        "1 / 100",
    )
    .await?;
    wait_text(
        client,
        &format!("{budget} td[data-col='recent-starts']"),
        "1 / 600",
    )
    .await?;

    // The job still waiting says what holds it back; its limit keys link to their limits.
    client
        .execute(
            "location.hash = arguments[0]; return true;",
            vec![json!(format!("#/jobs/{held}"))],
        )
        .await?;
    wait_present(client, &format!("#view-job[data-job='{held}']")).await?;
    wait_text(client, "#job-state", "available").await?;
    wait_text(
        client,
        "#job-blocked",
        "Held back by limit per-customer, key acme: 1/1 running",
    )
    .await?;
    ensure!(
        !text(client, "#job-blocked")
            .await?
            .unwrap_or_default()
            .contains("vendor-api"),
        "a limit with room does not hold the job back"
    );
    wait_text(client, "#job-limits", "per-customer: acme").await?;
    wait_present(client, "#job-limits a[href='#/limits/vendor-api']").await?;
    screenshot(client, "job-held-back").await?;
    // The job that runs holds the same keys, and nothing holds it back.
    client
        .execute(
            "location.hash = arguments[0]; return true;",
            vec![json!(format!("#/jobs/{}", running[0]))],
        )
        .await?;
    wait_text(client, "#job-state", "running").await?;
    wait_text(client, "#job-limits", "per-customer: acme").await?;
    ensure!(
        count(client, "#job-blocked").await? == 0,
        "a running job is not held back"
    );

    // The queue's settings name its limits, each linking to its page.
    click(client, "a[data-nav='overview']").await?;
    click(
        client,
        "tr[data-queue='sync'] button[data-action='settings']",
    )
    .await?;
    wait_text(client, "#qs-queue", "sync").await?;
    wait_text(client, "#qs-limits", "per-customer").await?;
    wait_text(client, "#qs-limits", "vendor-api").await?;
    click(client, "#qs-limits a[href='#/limits/per-customer']").await?;
    wait_present(client, "#view-limit[data-limit='per-customer']").await?;
    Ok(held)
}
