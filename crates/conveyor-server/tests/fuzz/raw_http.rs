//! A raw HTTP/1.1 client: one connection per request, `Connection: close`, bytes as generated.

use super::*;

#[derive(Clone)]
pub(super) struct Req {
    /// Whether it goes to the server with access control on.
    pub(super) auth_server: bool,
    pub(super) route: &'static str,
    pub(super) method: String,
    /// Path and query, already encoded.
    pub(super) target: String,
    pub(super) headers: Vec<(String, String)>,
    pub(super) body: Option<Vec<u8>>,
    /// What the generator did to the valid request, for the report.
    pub(super) mutations: Vec<String>,
    /// The JSON value sent, when the body is exactly its serialization.
    pub(super) sent: Option<Value>,
}

impl Req {
    pub(super) fn new(route: &'static str, method: &str, target: String) -> Self {
        Req {
            auth_server: false,
            route,
            method: method.to_string(),
            target,
            headers: Vec::new(),
            body: None,
            mutations: Vec::new(),
            sent: None,
        }
    }

    pub(super) fn json(route: &'static str, method: &str, target: String, body: &Value) -> Self {
        let mut req = Req::new(route, method, target);
        req.headers
            .push(("content-type".into(), "application/json".into()));
        req.body = Some(serde_json::to_vec(body).expect("serialize"));
        req.sent = Some(body.clone());
        req
    }

    pub(super) fn describe(&self) -> String {
        let mut out = format!(
            "[{} server] {} {}\n",
            if self.auth_server { "auth" } else { "open" },
            self.method,
            self.target
        );
        for (name, value) in &self.headers {
            let _ = writeln!(out, "  {name}: {}", value.escape_debug());
        }
        match &self.body {
            None => out.push_str("  (no body)\n"),
            Some(body) => {
                let shown = &body[..body.len().min(1500)];
                let _ = writeln!(
                    out,
                    "  body ({} bytes{}): {}",
                    body.len(),
                    if shown.len() < body.len() {
                        ", truncated"
                    } else {
                        ""
                    },
                    shown.escape_ascii()
                );
            }
        }
        if !self.mutations.is_empty() {
            let _ = writeln!(out, "  mutations: {}", self.mutations.join("; "));
        }
        out
    }
}

pub(super) struct Answer {
    pub(super) status: u16,
    pub(super) headers: Vec<(String, String)>,
    pub(super) body: Vec<u8>,
}

impl Answer {
    pub(super) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub(super) fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// Valid JSON nested deeper than serde_json's default limit of 128 levels, which Conveyor's
    /// own clients (`conveyor work`, the Rust client) use.
    pub(super) fn too_deep_for_serde(&self) -> bool {
        serde_json::from_slice::<Value>(&self.body)
            .is_err_and(|e| e.to_string().contains("recursion limit exceeded"))
    }

    pub(super) fn describe(&self) -> String {
        let shown = &self.body[..self.body.len().min(1500)];
        format!(
            "{} content-type={:?} body: {}",
            self.status,
            self.header("content-type").unwrap_or(""),
            shown.escape_ascii()
        )
    }
}

pub(super) async fn send(addr: SocketAddr, req: &Req) -> Result<Answer, String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut reader, mut writer) = stream.into_split();
    let mut head = format!(
        "{} {} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n",
        req.method, req.target
    );
    for (name, value) in &req.headers {
        let _ = write!(head, "{name}: {value}\r\n");
    }
    if let Some(body) = &req.body {
        let _ = write!(head, "content-length: {}\r\n", body.len());
    }
    head.push_str("\r\n");
    let body = req.body.clone().unwrap_or_default();
    // Write and read at once: the server may answer (413) before reading the whole body.
    let write = async move {
        writer.write_all(head.as_bytes()).await?;
        writer.write_all(&body).await?;
        writer.flush().await?;
        // Keep the write half open until the answer has been read (dropped with the future).
        Ok::<_, std::io::Error>(writer)
    };
    let read = async move {
        let mut buf = Vec::new();
        reader.read_to_end(&mut buf).await.map(|_| buf)
    };
    let both = async { tokio::join!(write, read) };
    let (_written, read) = tokio::time::timeout(REQUEST_TIMEOUT, both)
        .await
        .map_err(|_| format!("no answer within {REQUEST_TIMEOUT:?}"))?;
    let raw = read.map_err(|e| format!("read: {e}"))?;
    parse_answer(&raw)
}

pub(super) fn parse_answer(raw: &[u8]) -> Result<Answer, String> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| {
            format!(
                "connection closed without a complete answer ({} bytes: {})",
                raw.len(),
                raw[..raw.len().min(200)].escape_ascii()
            )
        })?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[end + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    if chunked {
        body = dechunk(&body)?;
    }
    Ok(Answer {
        status,
        headers,
        body,
    })
}

pub(super) fn dechunk(mut raw: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let line_end = raw
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("truncated chunked body")?;
        let size_text = String::from_utf8_lossy(&raw[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|e| format!("bad chunk size {size_text:?}: {e}"))?;
        raw = &raw[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if raw.len() < size + 2 {
            return Err("truncated chunk".into());
        }
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

/// Percent-encodes everything but unreserved characters.
pub(super) fn encode(text: &str) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~' | b':') {
            out.push(byte as char);
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}
