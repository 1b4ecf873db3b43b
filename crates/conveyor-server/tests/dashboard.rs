//! The dashboard's static files as the router serves them: content types, caching, the
//! Content-Security-Policy, no token needed, and sources that keep to what that policy allows.
//! (The browser-level test is `crates/conveyor/tests/dashboard_e2e.rs`.)

use conveyor_server::{router_with_options, AuthOptions, RouterOptions, ServerConfig};
use conveyor_sqlite::{SqliteOptions, SqliteStore};
use reqwest::StatusCode;
use std::path::{Path, PathBuf};
use std::sync::Arc;

struct Served {
    base: String,
    _dir: tempfile::TempDir,
}

async fn serve(auth: bool) -> Served {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("jobs.db"), SqliteOptions::default())
        .expect("open store");
    let options = RouterOptions {
        auth: AuthOptions {
            enabled: auth,
            ..AuthOptions::default()
        },
        ..RouterOptions::default()
    };
    let app = router_with_options(Arc::new(store), ServerConfig::default(), options);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        axum::serve(listener, app).await.expect("serve");
    });
    Served {
        base: format!("http://{addr}"),
        _dir: dir,
    }
}

/// Every file under `ui/`, as its path below it (`views/jobs.js`).
fn ui_files() -> Vec<String> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("read ui dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                walk(&path, root, out);
            } else {
                let relative = path.strip_prefix(root).expect("below ui/");
                out.push(relative.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("ui");
    let mut files = Vec::new();
    walk(&root, &root, &mut files);
    files.sort();
    files
}

fn header(response: &reqwest::Response, name: &str) -> String {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn every_file_is_served_with_its_type_policy_and_validator_and_without_a_token() {
    // With access control on: the page and its files carry no data, and the login page is
    // one of them.
    let served = serve(true).await;
    let http = reqwest::Client::new();
    let mut paths = vec![("/".to_string(), "text/html; charset=utf-8")];
    for file in ui_files() {
        let expected = match file.rsplit('.').next() {
            Some("html") => "text/html; charset=utf-8",
            Some("css") => "text/css; charset=utf-8",
            Some("js") => "text/javascript; charset=utf-8",
            Some("svg") => "image/svg+xml",
            other => panic!("ui/{file}: no content type for {other:?}; add it to ui.rs"),
        };
        paths.push((format!("/ui/{file}"), expected));
    }
    for (path, content_type) in paths {
        let response = http
            .get(format!("{}{path}", served.base))
            .send()
            .await
            .expect("GET");
        assert_eq!(
            response.status(),
            StatusCode::OK,
            "{path} (is it listed in ui.rs?)"
        );
        assert_eq!(header(&response, "content-type"), content_type, "{path}");
        let csp = header(&response, "content-security-policy");
        for directive in [
            "default-src 'self'",
            "script-src 'self'",
            "style-src 'self'",
            "frame-ancestors 'none'",
            "object-src 'none'",
        ] {
            assert!(
                csp.contains(directive),
                "{path}: {directive} missing in {csp}"
            );
        }
        assert!(!csp.contains("unsafe"), "{path}: {csp}");
        assert_eq!(header(&response, "x-content-type-options"), "nosniff");
        assert_eq!(header(&response, "cache-control"), "no-cache");
        let etag = header(&response, "etag");
        assert!(
            etag.starts_with('"') && etag.len() > 2,
            "{path}: etag {etag:?}"
        );

        // Revalidation: the same file answers 304 with no body.
        let again = http
            .get(format!("{}{path}", served.base))
            .header("if-none-match", &etag)
            .send()
            .await
            .expect("GET again");
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED, "{path}");
        assert!(again.bytes().await.expect("body").is_empty());
    }

    // The API next to it still wants a token; an unknown file is a JSON 404.
    let api = http
        .get(format!("{}/v1/queues", served.base))
        .send()
        .await
        .expect("GET queues");
    assert_eq!(api.status(), StatusCode::UNAUTHORIZED);
    let missing = http
        .get(format!("{}/ui/nope.js", served.base))
        .send()
        .await
        .expect("GET missing");
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    assert!(header(&missing, "content-type").starts_with("application/json"));
}

#[tokio::test]
async fn served_without_access_control_too() {
    let served = serve(false).await;
    let page = reqwest::get(format!("{}/", served.base))
        .await
        .expect("GET /");
    assert_eq!(page.status(), StatusCode::OK);
    let text = page.text().await.expect("body");
    assert!(text.contains(r#"<script type="module" src="/ui/app.js"></script>"#));
}

/// The sources keep to what the policy allows (no inline script or style, no event-handler
/// attributes) and never turn data into markup, which is what keeps payloads and error
/// messages from injecting anything.
#[test]
fn sources_need_nothing_the_policy_forbids() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("ui");
    let index = std::fs::read_to_string(root.join("index.html")).expect("index.html");
    let lower = index.to_lowercase();
    assert!(!lower.contains("<style"), "inline <style> in index.html");
    assert!(!lower.contains(" style="), "style attribute in index.html");
    for (i, _) in lower.match_indices("<script") {
        let tag = &lower[i..i + lower[i..].find('>').expect("tag end")];
        assert!(tag.contains(" src="), "inline script in index.html: {tag}");
    }
    for attribute in [
        " onclick=",
        " onload=",
        " onerror=",
        " onsubmit=",
        "javascript:",
    ] {
        assert!(!lower.contains(attribute), "{attribute} in index.html");
    }
    for file in ui_files().iter().filter(|f| f.ends_with(".js")) {
        let source = std::fs::read_to_string(root.join(file)).expect("js source");
        for forbidden in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "new Function",
            "setAttribute('style'",
        ] {
            assert!(!source.contains(forbidden), "ui/{file} uses {forbidden}");
        }
    }
}
