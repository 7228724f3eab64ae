//! The one way out of a pull. The registry client is given this proxy for plain HTTP and for
//! HTTPS, with no exceptions, so every connection it makes goes through here: the registry's
//! manifests and blobs, each redirect it follows (registries send blobs on to storage hosts),
//! the token service a registry's `WWW-Authenticate` challenge names. For each, the proxy looks
//! the host up itself, checks every address with [`super::resolve_checked`] (the rules an image
//! reference's registry is held to; hosts the operator listed in `[images]
//! insecure_registries` pass) and connects to a checked address, never to the name again. So a
//! redirect or a token realm cannot take a pull to an address a reference could not name, and
//! a name that answers a public address first and an internal one later (DNS rebinding) gains
//! nothing: the address checked is the address connected to.
//!
//! Plain-HTTP requests arrive in absolute form and are forwarded, each on its own upstream
//! connection; HTTPS ones arrive as `CONNECT` tunnels, TLS staying end to end between the
//! client and the registry (verified against the registry's name). The proxy listens on the
//! host's loopback (no sandbox reaches it: a sandbox's loopback is its own), lives as long as
//! the pull (dropping the [`Proxy`] ends it and every connection through it), and keeps what it
//! refused, for the build's error. It takes no credentials (the client drops a proxy's
//! credentials on the first redirect to another host), so a program of the host's could use it
//! while the pull lasts; it would get nothing the host does not give it directly, the same
//! rules holding for every connection.

use super::{host_port, resolve_checked, split_registry, Hop, Lookup, Registries};
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, HOST, PROXY_AUTHORIZATION};
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// What the proxy answers with: an empty status, or what the upstream sent.
type Body = BoxBody<Bytes, hyper::Error>;

/// How long one connection attempt to one address may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

struct Shared {
    /// The image's registry, as its reference writes it.
    registry: String,
    regs: Registries,
    lookup: Arc<dyn Lookup>,
    /// What was refused or could not be reached, first first.
    notes: Mutex<Vec<String>>,
    stop: CancellationToken,
}

impl Shared {
    fn note(&self, what: String) {
        if let Ok(mut n) = self.notes.lock() {
            n.push(what);
        }
    }
}

/// A running proxy for one pull.
pub(crate) struct Proxy {
    url: String,
    shared: Arc<Shared>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.cancel();
    }
}

impl Proxy {
    /// Starts a proxy for a pull from `registry` (as the image reference writes it).
    pub(crate) async fn start(
        registry: &str,
        regs: &Registries,
        lookup: Arc<dyn Lookup>,
    ) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            registry: registry.to_string(),
            regs: regs.clone(),
            lookup,
            notes: Mutex::new(Vec::new()),
            stop: CancellationToken::new(),
        });
        tokio::spawn(accept(listener, shared.clone()));
        Ok(Proxy {
            url: format!("http://127.0.0.1:{port}"),
            shared,
        })
    }

    /// The proxy's URL, for the registry client's proxy settings.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// What the proxy refused or could not reach so far, first first.
    pub(crate) fn notes(&self) -> Vec<String> {
        self.shared
            .notes
            .lock()
            .map(|n| n.clone())
            .unwrap_or_default()
    }
}

async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let stream = tokio::select! {
            _ = shared.stop.cancelled() => return,
            a = listener.accept() => match a {
                Ok((s, _)) => s,
                Err(_) => {
                    // Out of descriptors, say: try again shortly rather than spin.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let sh = shared.clone();
        tokio::spawn(async move {
            let stop = sh.stop.clone();
            let svc = hyper::service::service_fn(move |req| {
                let sh = sh.clone();
                async move { Ok::<_, Infallible>(handle(req, sh).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .with_upgrades();
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = conn => {}
            }
        });
    }
}

fn status(code: StatusCode) -> Response<Body> {
    let mut r = Response::new(Empty::new().map_err(|never| match never {}).boxed());
    *r.status_mut() = code;
    r
}

async fn handle(req: Request<Incoming>, sh: Arc<Shared>) -> Response<Body> {
    if req.method() == Method::CONNECT {
        tunnel(req, sh).await
    } else {
        forward(req, sh).await
    }
}

/// Connects to `host:port` (a name, or an address without brackets) on an address that
/// passed the check, noting why not when it cannot.
async fn dial(sh: &Shared, host: &str, port: u16) -> Result<TcpStream, StatusCode> {
    let (reg_host, reg_port) = split_registry(&sh.registry);
    let to_registry = reg_host.eq_ignore_ascii_case(host) && reg_port == port;
    let hop = if to_registry {
        Hop::Registry(&sh.registry)
    } else {
        Hop::Elsewhere(host_port(host, port))
    };
    let addrs = match resolve_checked(host, port, &hop, &sh.regs, &*sh.lookup).await {
        Ok(a) => a,
        Err(e) => {
            sh.note(e.to_string());
            return Err(StatusCode::FORBIDDEN);
        }
    };
    for a in addrs {
        if let Ok(Ok(s)) = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(a)).await {
            return Ok(s);
        }
    }
    sh.note(if to_registry {
        "could not connect to the registry".to_string()
    } else {
        format!(
            "could not connect to {}, where the registry sent the pull",
            host_port(host, port)
        )
    });
    Err(StatusCode::BAD_GATEWAY)
}

/// `host` of an authority, without the brackets of an IPv6 address.
fn bare(host: &str) -> &str {
    host.trim_start_matches('[').trim_end_matches(']')
}

/// A `CONNECT host:port` tunnel (HTTPS).
async fn tunnel(req: Request<Incoming>, sh: Arc<Shared>) -> Response<Body> {
    let Some(authority) = req.uri().authority().cloned() else {
        return status(StatusCode::BAD_REQUEST);
    };
    let port = authority.port_u16().unwrap_or(443);
    let mut upstream = match dial(&sh, bare(authority.host()), port).await {
        Ok(s) => s,
        Err(code) => return status(code),
    };
    let stop = sh.stop.clone();
    tokio::spawn(async move {
        let Ok(up) = hyper::upgrade::on(req).await else {
            return;
        };
        let mut client = TokioIo::new(up);
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
        }
    });
    status(StatusCode::OK)
}

/// A plain-HTTP request in absolute form, forwarded on a connection of its own.
async fn forward(req: Request<Incoming>, sh: Arc<Shared>) -> Response<Body> {
    let uri = req.uri().clone();
    let Some(authority) = uri.authority().cloned() else {
        return status(StatusCode::BAD_REQUEST);
    };
    if uri.scheme_str() != Some("http") {
        return status(StatusCode::BAD_REQUEST);
    }
    let port = authority.port_u16().unwrap_or(80);
    let upstream = match dial(&sh, bare(authority.host()), port).await {
        Ok(s) => s,
        Err(code) => return status(code),
    };
    let Ok((mut sender, conn)) =
        hyper::client::conn::http1::handshake(TokioIo::new(upstream)).await
    else {
        return status(StatusCode::BAD_GATEWAY);
    };
    let stop = sh.stop.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = conn => {}
        }
    });
    let (mut parts, body) = req.into_parts();
    let Ok(origin) = uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .parse::<Uri>()
    else {
        return status(StatusCode::BAD_REQUEST);
    };
    parts.uri = origin;
    parts.headers.remove(PROXY_AUTHORIZATION);
    parts.headers.remove("proxy-connection");
    if !parts.headers.contains_key(HOST) {
        if let Ok(h) = HeaderValue::from_str(authority.as_str()) {
            parts.headers.insert(HOST, h);
        }
    }
    match sender.send_request(Request::from_parts(parts, body)).await {
        Ok(resp) => resp.map(BodyExt::boxed),
        Err(_) => status(StatusCode::BAD_GATEWAY),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Answers every name with `addr`.
    struct Fixed(SocketAddr);

    impl Lookup for Fixed {
        fn lookup<'a>(
            &'a self,
            _host: &'a str,
            _port: u16,
        ) -> futures_util::future::BoxFuture<'a, std::io::Result<Vec<SocketAddr>>> {
            Box::pin(async move { Ok(vec![self.0]) })
        }
    }

    /// A server on loopback that answers every request `200 here` and counts connections.
    fn bystander() -> (SocketAddr, Arc<AtomicUsize>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let n = Arc::new(AtomicUsize::new(0));
        let n2 = n.clone();
        std::thread::spawn(move || {
            for mut c in l.incoming().flatten() {
                n2.fetch_add(1, Ordering::SeqCst);
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf);
                let _ = c.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\nconnection: close\r\n\r\nhere",
                );
            }
        });
        (addr, n)
    }

    /// Sends `head` to the proxy, answers what it says.
    async fn ask(p: &Proxy, head: &str) -> String {
        let port = p.url().parse::<Uri>().unwrap().port_u16().unwrap();
        let req = format!("{head}connection: close\r\n\r\n");
        let tunnel = head.starts_with("CONNECT");
        tokio::task::spawn_blocking(move || {
            let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            c.write_all(req.as_bytes()).unwrap();
            let mut out = Vec::new();
            let mut buf = [0u8; 4096];
            // A tunnel stays open: the status line is enough.
            while let Ok(n) = c.read(&mut buf) {
                if n == 0 {
                    break;
                }
                out.extend_from_slice(&buf[..n]);
                if out.windows(4).any(|w| w == b"\r\n\r\n") && tunnel {
                    break;
                }
            }
            String::from_utf8_lossy(&out).into_owned()
        })
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn connections_to_internal_addresses_are_refused_unless_listed() {
        let (at, seen) = bystander();
        let regs = Registries {
            insecure: vec!["registry.test:5000".into()],
            listen: None,
        };
        // A name that resolves to the bystander on loopback, as a rebinding name would.
        let p = Proxy::start("registry.test:5000", &regs, Arc::new(Fixed(at)))
            .await
            .unwrap();
        let port = at.port();
        for head in [
            format!(
                "GET http://storage.test:{port}/blob HTTP/1.1\r\nhost: storage.test:{port}\r\n"
            ),
            format!("GET http://127.0.0.1:{port}/blob HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"),
            format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"),
            format!("CONNECT storage.test:{port} HTTP/1.1\r\nhost: storage.test:{port}\r\n"),
        ] {
            let r = ask(&p, &head).await;
            assert!(r.starts_with("HTTP/1.1 403"), "{head}: {r}");
        }
        assert_eq!(seen.load(Ordering::SeqCst), 0, "nothing reached it");
        let notes = p.notes();
        assert_eq!(notes.len(), 4, "{notes:?}");
        assert!(
            notes[0].contains(&format!("storage.test:{port}"))
                && notes[0].contains("127.0.0.1, a loopback address")
                && notes[0].contains("insecure_registries"),
            "{notes:?}"
        );
        drop(p);

        // The listed registry is reached, on the address the proxy looked up.
        let regs = Registries {
            insecure: vec![format!("registry.test:{port}")],
            listen: None,
        };
        let p = Proxy::start(&format!("registry.test:{port}"), &regs, Arc::new(Fixed(at)))
            .await
            .unwrap();
        let r = ask(
            &p,
            &format!(
                "GET http://registry.test:{port}/v2/ HTTP/1.1\r\nhost: registry.test:{port}\r\n"
            ),
        )
        .await;
        assert!(r.starts_with("HTTP/1.1 200") && r.ends_with("here"), "{r}");
        assert_eq!(seen.load(Ordering::SeqCst), 1);
        assert!(p.notes().is_empty());
    }
}
