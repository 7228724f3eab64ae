//! OCI images as template bases: pull from a registry (anonymous, or basic auth; manifest lists
//! resolved to this machine's platform), unpack each layer once into the layer store, and turn
//! the image's whiteouts into overlayfs's own (a `.wh.<name>` entry becomes a 0/0 character
//! device, `.wh..wh..opq` the directory's `trusted.overlay.opaque` attribute), so the layers
//! stack under overlayfs exactly as the image says.
//!
//! The registry protocol is `oci-client`'s (a maintained crate: auth flows, manifest lists);
//! unpacking is the `tar` crate's, which refuses entries that would land outside the layer
//! directory. Layers are kept by digest under `DATA/layers/oci-sha256-<hex>` (see
//! [`crate::layers`]), so images that share layers share them on disk.
//!
//! What a registry or an archive says is not trusted: every digest is parsed into a
//! [`Digest`] before anything is named after it; every blob is hashed while it is downloaded
//! (or read from the archive) and used only when it hashes to its digest, a mismatch leaving
//! nothing behind; a layer is marked verified only after that; and a workspace reuses a layer
//! of the store only once it has shown it has the layer's bytes itself (so knowing a digest of
//! another workspace's private image gives nothing). Registries on loopback, link-local or
//! private addresses, or this host's own, are refused unless the operator lists them in
//! `[images] insecure_registries` (the registries spoken to over plain HTTP); foreign layer URLs
//! are never fetched; and what a registry answers reaches the build log only as a status and a
//! short reason.
//!
//! A pull or an import is in two steps, for the workspace's storage quota (see
//! the server's `quotas`): [`pull`] and [`prepare_archive`] check, unpack and measure the layers
//! beside the store within a [`Budget`] (a download stops once it passes the room left), and
//! answer a [`Prepared`] image; only its [`Prepared::commit`], once the caller has charged the
//! layers, moves them into the store and records the workspace's proofs. Dropped uncommitted,
//! it leaves nothing.
//!
//! The address rules hold for every connection of a pull, not only for the reference's
//! registry: the registry client's only way out is the pull's own proxy (`oci/proxy.rs`), which
//! looks each host up once, refuses it when any of its addresses is of the kinds above (a
//! listed host excepted), and connects to the address it checked. So a registry cannot send a
//! pull to an internal address by a redirect (the client follows at most 10) or by naming
//! such a token service in its `WWW-Authenticate` challenge, nor by answering its name with a
//! public address to the check and a private one to the connection. The build's error then
//! names the host, the address and how an operator allows it. [`check_registry`] is the same
//! rule applied early, when a template is created, for a clear 400.
//!
//! Unpacking: the first bytes of a layer decide its decompression (gzip `1f 8b`, zstd
//! `28 b5 2f fd`, else plain tar; a media type ending in `+gzip` or `+zstd` on anything else is an
//! error); entries unpack with permissions and owners and without extended attributes, whiteouts
//! through `safe_join` (no `..`, no symlink on the way); device nodes and FIFOs are skipped.
//! `defaults_of` reads `Env`, `WorkingDir` (when absolute) and `User` (`root` or `0`, with or
//! without a group: root; any other: `user`) from the image's configuration. The skeleton layer
//! holds the mount points (`proc`, `sys`, `dev`, `run`, `tmp` 1777), `home/user` and the
//! server's resolvers, laid over every image template.

use crate::layers::{self, Digest, Dir, Hasher};
use cella_types::{ExecUser, RegistryAuth};
use futures_util::StreamExt;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth as Auth;
use oci_client::Client;
pub use oci_client::Reference;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod proxy;

/// An image config or manifest larger than this is refused.
const MAX_JSON: u64 = 4 << 20;

/// What an image's config asks of its containers, as far as a template uses it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ImageDefaults {
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    pub user: Option<ExecUser>,
}

/// An image pulled and unpacked: its layers, topmost first.
#[derive(Debug, Clone)]
pub struct Pulled {
    pub digest: String,
    pub layers: Vec<PathBuf>,
    pub defaults: ImageDefaults,
}

/// Which registries a pull may reach, and how.
#[derive(Debug, Clone, Default)]
pub struct Registries {
    /// `host:port` of registries allowed on any address, spoken to over plain HTTP.
    pub insecure: Vec<String>,
    /// The server's own listen address, never a registry.
    pub listen: Option<SocketAddr>,
}

impl Registries {
    fn protocol(&self) -> ClientProtocol {
        ClientProtocol::HttpsExcept(self.insecure.clone())
    }

    /// Whether the operator listed `host` on `port` (an entry without a port stands for the
    /// default ports, 80 and 443).
    pub(crate) fn listed(&self, host: &str, port: u16) -> bool {
        self.insecure.iter().any(|r| {
            let (h, p) = split_host(r);
            h.eq_ignore_ascii_case(host) && p.map_or(port == 80 || port == 443, |p| p == port)
        })
    }
}

/// Why a registry, or a host a registry sends the pull on to, may not be used.
#[derive(Debug, thiserror::Error)]
pub enum RegistryRefused {
    #[error("registry {registry} is at {addr}, {what}: refused (an operator can allow it by listing \"{registry}\" in the server's [images] insecure_registries)")]
    Address {
        registry: String,
        addr: IpAddr,
        what: &'static str,
    },
    #[error("registry {0}: its host name does not resolve")]
    Unresolved(String),
    /// A host other than the image's registry: a redirect's target or a token service.
    #[error("the registry sent the pull on to {host} (a redirect or its token service), which is at {addr}, {what}: refused (an operator can allow it by listing \"{host}\" in the server's [images] insecure_registries)")]
    Elsewhere {
        host: String,
        addr: IpAddr,
        what: &'static str,
    },
    #[error("the registry sent the pull on to {0} (a redirect or its token service), whose host name does not resolve")]
    ElsewhereUnresolved(String),
}

/// What kind of address `ip` is, when a registry may not be there.
fn forbidden(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return forbidden_v4(v4);
            }
            let s = v6.segments();
            // NAT64 (64:ff9b::/96) carries an IPv4 address.
            if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                let o = v6.octets();
                return forbidden_v4(Ipv4Addr::new(o[12], o[13], o[14], o[15]));
            }
            if v6.is_loopback() {
                Some("a loopback address")
            } else if v6.is_unspecified() {
                Some("the unspecified address")
            } else if s[0] & 0xfe00 == 0xfc00 {
                Some("a private (unique local) address")
            } else if s[0] & 0xffc0 == 0xfe80 {
                Some("a link-local address")
            } else if v6.is_multicast() {
                Some("a multicast address")
            } else if s[0] == 0 && s[1..6] == [0; 5] {
                // ::a.b.c.d, the deprecated IPv4-compatible form.
                let o = v6.octets();
                forbidden_v4(Ipv4Addr::new(o[12], o[13], o[14], o[15]))
            } else {
                None
            }
        }
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    if ip.is_loopback() {
        Some("a loopback address")
    } else if o[0] == 0 {
        Some("the unspecified address")
    } else if ip.is_private() {
        Some("a private address")
    } else if o[0] == 100 && o[1] & 0xc0 == 64 {
        Some("a shared (CGNAT) address")
    } else if ip.is_link_local() {
        Some("a link-local address")
    } else if ip.is_multicast() || ip.is_broadcast() || o[0] >= 240 {
        Some("a multicast or reserved address")
    } else {
        None
    }
}

/// The host's own addresses (every interface's).
fn own_addresses() -> Vec<IpAddr> {
    let Ok(ifs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    ifs.filter_map(|i| i.address)
        .filter_map(|a| {
            a.as_sockaddr_in()
                .map(|s| IpAddr::V4(s.ip()))
                .or_else(|| a.as_sockaddr_in6().map(|s| IpAddr::V6(s.ip())))
        })
        .collect()
}

/// Looks host names up: the system's resolver, or a stand-in in tests.
pub(crate) trait Lookup: Send + Sync + 'static {
    fn lookup<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> futures_util::future::BoxFuture<'a, std::io::Result<Vec<SocketAddr>>>;
}

/// The system's resolver.
pub(crate) struct SystemLookup;

impl Lookup for SystemLookup {
    fn lookup<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> futures_util::future::BoxFuture<'a, std::io::Result<Vec<SocketAddr>>> {
        Box::pin(async move { Ok(tokio::net::lookup_host((host, port)).await?.collect()) })
    }
}

/// What a host is to a pull, for what a refusal says.
pub(crate) enum Hop<'a> {
    /// The image's registry, as the reference writes it.
    Registry(&'a str),
    /// Any other host (`host:port`): a redirect's target, a token service.
    Elsewhere(String),
}

impl Hop<'_> {
    fn refused(&self, addr: IpAddr, what: &'static str) -> RegistryRefused {
        match self {
            Hop::Registry(r) => RegistryRefused::Address {
                registry: r.to_string(),
                addr,
                what,
            },
            Hop::Elsewhere(h) => RegistryRefused::Elsewhere {
                host: h.clone(),
                addr,
                what,
            },
        }
    }

    fn unresolved(&self) -> RegistryRefused {
        match self {
            Hop::Registry(r) => RegistryRefused::Unresolved(r.to_string()),
            Hop::Elsewhere(h) => RegistryRefused::ElsewhereUnresolved(h.clone()),
        }
    }
}

/// `host:port` as a URL or an image reference writes it (`[v6]:port`).
pub(crate) fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// `host` and port of a registry as an image reference writes it (`host`, `host:port`,
/// `[v6]:port`); without a port, 443.
fn split_registry(registry: &str) -> (String, u16) {
    let (h, p) = split_host(registry);
    (h, p.unwrap_or(443))
}

/// `host` and, when it has one, the port of `host`, `host:port` or `[v6]:port`.
fn split_host(registry: &str) -> (String, Option<u16>) {
    if let Some(rest) = registry.strip_prefix('[') {
        if let Some((h, tail)) = rest.split_once(']') {
            return (
                h.to_string(),
                tail.strip_prefix(':').and_then(|p| p.parse().ok()),
            );
        }
    }
    match registry.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => (h.to_string(), p.parse().ok()),
        _ => (registry.to_string(), None),
    }
}

/// The addresses of `host` (a name or an address, without brackets) that a pull may connect
/// to on `port`: every address it has when the operator listed it, else all of them only if
/// none is of the kinds above nor one of this host's (one such address refuses the host). The
/// name is looked up once, here: a caller connects to these addresses, never to the name, so
/// the address checked is the address connected to.
pub(crate) async fn resolve_checked(
    host: &str,
    port: u16,
    hop: &Hop<'_>,
    regs: &Registries,
    lookup: &dyn Lookup,
) -> Result<Vec<SocketAddr>, RegistryRefused> {
    let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => lookup
            .lookup(host, port)
            .await
            .map_err(|_| hop.unresolved())?,
    };
    if addrs.is_empty() {
        return Err(hop.unresolved());
    }
    if regs.listed(host, port) {
        return Ok(addrs);
    }
    let own = own_addresses();
    for addr in &addrs {
        let ip = addr.ip();
        let what = forbidden(ip).or_else(|| {
            (own.contains(&ip) || regs.listen.is_some_and(|l| l.ip() == ip))
                .then_some("this server's own address")
        });
        if let Some(what) = what {
            return Err(hop.refused(ip, what));
        }
    }
    Ok(addrs)
}

/// Refuses a registry whose host is (or resolves to any) address of the kinds above, or one of
/// this host's, unless the operator listed it. An early check, for a clear error before
/// anything is asked of anyone: the pull checks again every address it connects to (see
/// `proxy`).
pub async fn check_registry(registry: &str, regs: &Registries) -> Result<(), RegistryRefused> {
    let (host, port) = split_registry(registry);
    if regs.listed(&host, port) {
        return Ok(());
    }
    resolve_checked(&host, port, &Hop::Registry(registry), regs, &SystemLookup)
        .await
        .map(|_| ())
}

/// A registry's failure in a few words: its status and a short reason, never its body.
fn registry_error(e: &OciDistributionError) -> String {
    use OciDistributionError as E;
    match e {
        E::ServerError { code, .. } => format!("the registry answered HTTP {code}"),
        E::RegistryError { envelope, .. } => {
            let codes: Vec<String> = envelope
                .errors
                .iter()
                .take(3)
                .map(|e| format!("{:?}", e.code))
                .collect();
            format!("the registry refused ({})", codes.join(", "))
        }
        E::UnauthorizedError { .. } => "the registry answered HTTP 401 (not authorized)".into(),
        E::AuthenticationFailure(_) => "authenticating with the registry failed".into(),
        E::ImageManifestNotFoundError(_) => "the registry has no such image manifest".into(),
        E::DigestError(_) => "the registry sent content that does not match its digest".into(),
        E::RequestError(r) => match r.status() {
            Some(s) => format!("the registry answered HTTP {}", s.as_u16()),
            None if r.is_timeout() => "the registry did not answer in time".into(),
            None if r.is_connect() => "could not connect to the registry".into(),
            None => "the request to the registry failed".into(),
        },
        E::ManifestParsingError(_)
        | E::VersionedParsingError(_)
        | E::JsonError(_)
        | E::ManifestEncodingError(_) => {
            "the registry's manifest is not a valid image manifest".into()
        }
        E::UnsupportedMediaTypeError(_) | E::IncompatibleLayerMediaTypeError(_) => {
            "the manifest's media type is not supported".into()
        }
        E::UnsupportedSchemaVersionError(v) => {
            format!("manifest schema version {v} is not supported")
        }
        E::ImageIndexParsingNoPlatformResolverError => {
            "the image index has no manifest for this platform".into()
        }
        _ => "the registry's answer could not be used".into(),
    }
}

/// Downloads blob `digest` into `out`, hashing it on the way; `max` bounds its size. Fetched
/// from the registry of `reference` only (a descriptor's foreign URLs are never used).
async fn fetch_blob(
    client: &Client,
    reference: &Reference,
    digest: &Digest,
    out: &mut (dyn Write + Send),
    max: u64,
    too_big: &(dyn Fn() -> String + Send + Sync),
) -> Result<(), String> {
    let d = digest.to_string();
    let mut stream = client
        .pull_blob_stream(reference, d.as_str())
        .await
        .map_err(|e| format!("pulling {d}: {}", registry_error(&e)))?;
    let mut hasher = Hasher::default();
    let mut total = 0u64;
    while let Some(chunk) = stream.stream.next().await {
        // The crate's own check of the digest fails the stream: say it as ours does.
        let chunk = chunk.map_err(|_| {
            format!("pulling {d}: the download failed or does not match its digest")
        })?;
        total += chunk.len() as u64;
        if total > max {
            return Err(too_big());
        }
        hasher.update(&chunk);
        out.write_all(&chunk)
            .map_err(|e| format!("writing {d}: {e}"))?;
    }
    hasher.check(digest).map_err(|e| e.to_string())
}

/// The file a workspace's proof of having a layer's bytes is kept in, in the layer directory.
fn proof_name(workspace: &str) -> String {
    format!("seen-{}", hex::encode(workspace.as_bytes()))
}

/// Whether layer `d` is in the store, verified, and known to `workspace`.
fn usable(root: &Dir, d: &Digest, workspace: &str) -> bool {
    let name = d.layer_name();
    layers::is_ready(root, &name, layers::VERIFIED)
        && root.has_file(&format!("{name}/{}", proof_name(workspace)))
}

/// Records that `workspace` has shown it has the bytes of layer `d`.
fn prove(root: &Dir, d: &Digest, workspace: &str) -> Result<(), String> {
    root.dir(&d.layer_name())
        .and_then(|l| l.create_file(&proof_name(workspace)))
        .map(|_| ())
        .map_err(|e| format!("recording layer {}: {e}", d.short()))
}

/// Files the download or unpack of one layer left, removed whatever happens.
struct Scratch {
    root: Arc<Dir>,
    names: Vec<String>,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = self.root.remove_all(n);
        }
    }
}

/// Pulls `image` and unpacks its layers next to the store under `layers_root`, for
/// `workspace`, within `budget`; `log` hears of each layer. Nothing is in the store until the
/// answer is [committed](Prepared::commit).
pub async fn pull(
    image: &str,
    auth: Option<&RegistryAuth>,
    layers_root: &Path,
    regs: &Registries,
    workspace: &str,
    budget: &Budget,
    mut log: impl FnMut(String),
) -> Result<Prepared, String> {
    let reference: Reference = image
        .parse()
        .map_err(|e| format!("{image:?} is not an image reference: {e}"))?;
    let registry = reference.resolve_registry().to_string();
    check_registry(&registry, regs)
        .await
        .map_err(|e| e.to_string())?;
    // Every connection of the client goes through the proxy, which checks the address it
    // connects to (the registry's, a redirect's, a token service's).
    let proxy = proxy::Proxy::start(&registry, regs, Arc::new(SystemLookup))
        .await
        .map_err(|e| format!("pulling {image}: starting the pull's proxy: {e}"))?;
    let client = Client::try_from(ClientConfig {
        protocol: regs.protocol(),
        http_proxy: Some(proxy.url().to_string()),
        https_proxy: Some(proxy.url().to_string()),
        no_proxy: None,
        ..Default::default()
    })
    .map_err(|_| format!("pulling {image}: the registry client could not be set up"))?;
    // A failure after the proxy refused (or could not reach) a host is told by that.
    let explain = |e: String| match proxy.notes().into_iter().next() {
        Some(n) => format!("pulling {image}: {n}"),
        None => e,
    };
    let auth = match auth {
        Some(a) => Auth::Basic(a.username.clone(), a.password.clone()),
        None => Auth::Anonymous,
    };
    let (manifest, digest) = client
        .pull_image_manifest(&reference, &auth)
        .await
        .map_err(|e| explain(format!("pulling {image}: {}", registry_error(&e))))?;
    // Every digest first: nothing is fetched or named after a manifest that has a bad one.
    let config_digest =
        Digest::parse(&manifest.config.digest).map_err(|e| format!("the image's config: {e}"))?;
    let digests = manifest
        .layers
        .iter()
        .map(|l| Digest::parse(&l.digest).map_err(|e| format!("a layer of the image: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let mut config = Vec::new();
    fetch_blob(
        &client,
        &reference,
        &config_digest,
        &mut config,
        MAX_JSON,
        &|| format!("pulling {config_digest}: the blob is larger than {MAX_JSON} bytes"),
    )
    .await
    .map_err(explain)?;
    let config = String::from_utf8(config).map_err(|_| "the image's config is not UTF-8")?;
    log(format!(
        "  image {image} ({digest}), {} layer(s)\n",
        manifest.layers.len()
    ));
    let root = Arc::new(Dir::create(layers_root).map_err(|e| format!("the layer store: {e}"))?);
    let mut prep = Prepared::new(root.clone(), layers_root, workspace, digest.to_string());
    prep.defaults = defaults_of(&config);
    for (layer, d) in manifest.layers.iter().zip(&digests) {
        let name = d.layer_name();
        if layer.urls.as_ref().is_some_and(|u| !u.is_empty()) {
            log(format!(
                "  layer {} lists foreign URLs: not used, the layer comes from the registry\n",
                d.short()
            ));
        }
        if prep.has(&name) {
            prep.repeat(d);
            continue;
        }
        if usable(&root, d, workspace) {
            log(format!("  layer {} (cached)\n", d.short()));
            let size = budget.size_in_store(&root, &name)?;
            prep.add(d, None, false, size, budget)
                .map_err(|e| e.to_string())?;
            continue;
        }
        let tmp = format!(".download-{}", crate::unique_suffix());
        let part = format!(".part-{}", crate::unique_suffix());
        let _scratch = Scratch {
            root: root.clone(),
            names: vec![tmp.clone()],
        };
        prep.scratch.names.push(part.clone());
        let mut file = root
            .create_file(&tmp)
            .map_err(|e| format!("layer file: {e}"))?;
        // Blocking writes to a local file, in a pull that is a build's own task. A download
        // stops once it passes what the workspace's quota leaves (a layer unpacks to at least
        // about its compressed size).
        let left = budget.left(prep.spent, &name);
        let mut w = std::io::BufWriter::new(&mut file);
        fetch_blob(&client, &reference, d, &mut w, left, &|| {
            PrepareError::OverQuota {
                needed: left.saturating_add(1),
                room: left,
            }
            .to_string()
        })
        .await
        .map_err(explain)?;
        w.flush().map_err(|e| format!("layer file: {e}"))?;
        drop(w);
        drop(file);
        if layers::is_ready(&root, &name, layers::VERIFIED) {
            // Unpacked before from the same bytes; this workspace has now shown it has them.
            log(format!("  layer {} (cached, verified)\n", d.short()));
            let size = budget.size_in_store(&root, &name)?;
            prep.add(d, None, true, size, budget)
                .map_err(|e| e.to_string())?;
        } else {
            let (r2, media, tmp2, part2, room) = (
                root.clone(),
                layer.media_type.clone(),
                tmp.clone(),
                part.clone(),
                budget.room,
            );
            let (count, bytes) = tokio::task::spawn_blocking(move || {
                let blob = r2.file(&tmp2).map_err(|e| format!("layer file: {e}"))?;
                let count = unpack_part(&r2, blob, &media, &part2, left)
                    .map_err(|e| e.prepare(room).to_string())?;
                let bytes = layers::disk_bytes(&r2.path().join(&part2))
                    .map_err(|e| format!("measuring the layer: {e}"))?;
                Ok::<_, String>((count, bytes))
            })
            .await
            .map_err(|e| e.to_string())??;
            log(format!("  layer {} unpacked ({count} files)\n", d.short()));
            prep.add(d, Some(part), true, bytes, budget)
                .map_err(|e| e.to_string())?;
        }
    }
    // What was refused without failing the pull (a token service, when the registry then
    // answered anonymously) is said all the same.
    for n in proxy.notes() {
        log(format!("  {n}\n"));
    }
    Ok(prep)
}

/// How many bytes an image may add to a workspace's storage, and the layers the workspace pays
/// for already, with their sizes (they cost nothing more).
#[derive(Debug, Clone)]
pub struct Budget {
    pub room: u64,
    pub charged: std::collections::HashMap<String, u64>,
}

impl Budget {
    /// No quota.
    pub fn unlimited() -> Budget {
        Budget {
            room: u64::MAX,
            charged: Default::default(),
        }
    }

    /// What is left after `spent`, for layer `name`.
    fn left(&self, spent: u64, name: &str) -> u64 {
        if self.charged.contains_key(name) {
            u64::MAX
        } else {
            self.room.saturating_sub(spent)
        }
    }

    /// The size of layer `name`, in the store already.
    fn size_in_store(&self, root: &Dir, name: &str) -> Result<u64, String> {
        if let Some(size) = self.charged.get(name) {
            return Ok(*size);
        }
        layers::disk_bytes(&root.path().join(name).join("root"))
            .map_err(|e| format!("measuring layer {name}: {e}"))
    }
}

/// Why an image's layers were not made ready.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("{0}")]
    Invalid(String),
    #[error("the image's layers need more than the {room} bytes left of the workspace's storage quota (nothing of them was kept)")]
    OverQuota { needed: u64, room: u64 },
}

impl From<String> for PrepareError {
    fn from(s: String) -> Self {
        PrepareError::Invalid(s)
    }
}

impl From<&str> for PrepareError {
    fn from(s: &str) -> Self {
        PrepareError::Invalid(s.to_string())
    }
}

/// One layer of a [`Prepared`] image.
#[derive(Debug, Clone)]
pub struct PreparedLayer {
    digest: Digest,
    /// The name of the layer in the store.
    pub name: String,
    /// Its unpacked files, in a scratch directory of the store, when the store lacks it.
    part: Option<String>,
    /// Whether the workspace has shown its bytes here (and not before).
    prove: bool,
    /// Its size on disk.
    pub bytes: u64,
}

/// An image whose layers are checked, unpacked and measured but not in the store yet: the
/// caller checks the workspace's quota, then [commits](Prepared::commit) it. Dropped
/// uncommitted, it leaves nothing behind.
pub struct Prepared {
    root: Arc<Dir>,
    layers_root: PathBuf,
    workspace: String,
    digest: String,
    defaults: ImageDefaults,
    /// Bottom first; a layer the image lists twice is here once.
    pub layers: Vec<PreparedLayer>,
    /// The image's layer names, bottom first, repeats included.
    order: Vec<String>,
    /// What the layers the workspace does not pay for yet take, together.
    pub spent: u64,
    scratch: Scratch,
}

impl Prepared {
    fn new(root: Arc<Dir>, layers_root: &Path, workspace: &str, digest: String) -> Prepared {
        Prepared {
            scratch: Scratch {
                root: root.clone(),
                names: Vec::new(),
            },
            root,
            layers_root: layers_root.to_path_buf(),
            workspace: workspace.to_string(),
            digest,
            defaults: ImageDefaults::default(),
            layers: Vec::new(),
            order: Vec::new(),
            spent: 0,
        }
    }

    fn has(&self, name: &str) -> bool {
        self.layers.iter().any(|l| l.name == name)
    }

    fn repeat(&mut self, d: &Digest) {
        self.order.push(d.layer_name());
    }

    fn add(
        &mut self,
        d: &Digest,
        part: Option<String>,
        prove: bool,
        bytes: u64,
        budget: &Budget,
    ) -> Result<(), PrepareError> {
        let cost = if budget.charged.contains_key(&d.layer_name()) {
            0
        } else {
            bytes
        };
        let spent = self.spent.saturating_add(cost);
        if spent > budget.room {
            return Err(PrepareError::OverQuota {
                needed: spent,
                room: budget.room,
            });
        }
        self.spent = spent;
        self.order.push(d.layer_name());
        self.layers.push(PreparedLayer {
            digest: d.clone(),
            name: d.layer_name(),
            part,
            prove,
            bytes,
        });
        Ok(())
    }

    /// (name, size) of each layer, as they are charged.
    pub fn charges(&self) -> Vec<(String, u64)> {
        self.layers
            .iter()
            .map(|l| (l.name.clone(), l.bytes))
            .collect()
    }

    /// Puts the layers in the store (a layer another pull put there meanwhile is kept as it
    /// is) and records that the workspace has their bytes; answers the image, topmost layer
    /// first.
    pub fn commit(self) -> Result<Pulled, String> {
        for l in &self.layers {
            if let Some(part) = &l.part {
                layers::install(&self.root, part, &l.name, layers::VERIFIED)
                    .map_err(|e| format!("keeping layer {}: {e}", l.digest.short()))?;
            }
            if !layers::is_ready(&self.root, &l.name, layers::VERIFIED) {
                return Err(format!(
                    "layer {} left the store meanwhile; try again",
                    l.digest.short()
                ));
            }
            if l.prove {
                prove(&self.root, &l.digest, &self.workspace)?;
            }
        }
        let mut out: Vec<PathBuf> = self
            .order
            .iter()
            .map(|n| self.layers_root.join(n).join("root"))
            .collect();
        out.reverse();
        Ok(Pulled {
            digest: self.digest.clone(),
            layers: out,
            defaults: self.defaults.clone(),
        })
    }
}

/// Reads all of `f`, at most `max` bytes.
fn read_capped(f: std::fs::File, max: u64, what: &str) -> Result<Vec<u8>, String> {
    let mut b = Vec::new();
    f.take(max + 1)
        .read_to_end(&mut b)
        .map_err(|e| format!("{what}: {e}"))?;
    if b.len() as u64 > max {
        return Err(format!("{what} is larger than {max} bytes"));
    }
    Ok(b)
}

/// Reads an image from an archive on this host: an OCI layout (`oci-layout`, `index.json`,
/// `blobs/`) or a `docker save` tarball (`manifest.json`), as a tar file, for `workspace`,
/// within `budget`. Every blob must hash to its digest; its layers are unpacked next to the
/// store, to go in it like pulled ones when the answer is [committed](Prepared::commit);
/// `work` is an empty scratch directory. On any error nothing is added to the store.
pub fn prepare_archive(
    archive: &Path,
    layers_root: &Path,
    work: &Path,
    workspace: &str,
    budget: &Budget,
) -> Result<Prepared, PrepareError> {
    let f = std::fs::File::open(archive).map_err(|e| e.to_string())?;
    let mut a = tar::Archive::new(f);
    a.set_preserve_permissions(false);
    a.unpack(work)
        .map_err(|e| format!("reading the archive: {e}"))?;
    let w = Dir::open(work).map_err(|e| e.to_string())?;
    // Inside the archive's own tree only (a symlink of it may point within it, no further).
    let open = |rel: &str| -> Result<std::fs::File, String> {
        w.file_within(rel).map_err(|e| match e.raw_os_error() {
            Some(libc::EXDEV) | Some(libc::ELOOP) => format!(
                "{} in the archive is a symlink out of the archive",
                layers::quoted(rel)
            ),
            Some(libc::ENOENT) => format!("{} is not in the archive", layers::quoted(rel)),
            _ => format!("{} in the archive: {e}", layers::quoted(rel)),
        })
    };
    let json = |rel: &str, bytes: &[u8]| -> Result<serde_json::Value, String> {
        serde_json::from_slice(bytes)
            .map_err(|e| format!("{} in the archive: {e}", layers::quoted(rel)))
    };
    let blob_rel = |d: &Digest| format!("blobs/sha256/{}", d.hex());
    // A small blob, checked against its digest.
    let small_blob = |d: &Digest| -> Result<Vec<u8>, String> {
        let b = read_capped(open(&blob_rel(d))?, MAX_JSON, &format!("blob {d}"))?;
        if Digest::of(&b) != *d {
            return Err(format!("blob {d} in the archive does not match its digest"));
        }
        Ok(b)
    };
    let digest_at = |v: &serde_json::Value, what: &str| -> Result<Digest, String> {
        Digest::parse(v.as_str().unwrap_or("")).map_err(|e| format!("{what}: {e}"))
    };
    // (layer file, media type, digest) bottom first, the config, and the image's digest.
    let (layers, config, digest): (Vec<(String, String, Digest)>, String, String) = if w
        .has_file("oci-layout")
    {
        let index = json(
            "index.json",
            &read_capped(open("index.json")?, MAX_JSON, "index.json")?,
        )?;
        let mut desc = index["manifests"][0].clone();
        // An index inside: this machine's platform, else the first entry.
        let mut depth = 0;
        while desc["mediaType"]
            .as_str()
            .is_some_and(|m| m.contains("index") || m.contains("manifest.list"))
        {
            depth += 1;
            if depth > 4 {
                return Err("image indexes nested too deep".into());
            }
            let d = digest_at(&desc["digest"], "an image index")?;
            let inner = json(&blob_rel(&d), &small_blob(&d)?)?;
            let list = inner["manifests"].as_array().cloned().unwrap_or_default();
            desc = list
                .iter()
                .find(|m| {
                    m["platform"]["architecture"]
                        == std::env::consts::ARCH
                            .replace("x86_64", "amd64")
                            .replace("aarch64", "arm64")
                            .as_str()
                        && m["platform"]["os"] == "linux"
                })
                .or(list.first())
                .cloned()
                .ok_or("an empty image index")?;
        }
        if desc.is_null() {
            return Err("no manifest in index.json".into());
        }
        let md = digest_at(&desc["digest"], "the image's manifest")?;
        let manifest = json(&blob_rel(&md), &small_blob(&md)?)?;
        let cd = digest_at(&manifest["config"]["digest"], "the image's config")?;
        let config =
            String::from_utf8(small_blob(&cd)?).map_err(|_| "the image's config is not UTF-8")?;
        let layers = manifest["layers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|l| {
                let d = digest_at(&l["digest"], "a layer of the image")?;
                Ok((
                    blob_rel(&d),
                    l["mediaType"].as_str().unwrap_or("").to_string(),
                    d,
                ))
            })
            .collect::<Result<Vec<_>, String>>()?;
        (layers, config, md.to_string())
    } else if w.has_file("manifest.json") {
        let m = json(
            "manifest.json",
            &read_capped(open("manifest.json")?, MAX_JSON, "manifest.json")?,
        )?;
        let first = &m[0];
        let cfg = first["Config"]
            .as_str()
            .ok_or("manifest.json names no config")?;
        let config = String::from_utf8(read_capped(open(cfg)?, MAX_JSON, "the image's config")?)
            .map_err(|_| "the image's config is not UTF-8")?;
        let mut layers = Vec::new();
        for l in first["Layers"].as_array().into_iter().flatten() {
            let rel = l.as_str().unwrap_or("").to_string();
            // Named by what it holds: its own hash is its digest.
            let d = layers::digest_of(open(&rel)?)
                .map_err(|e| format!("{} in the archive: {e}", layers::quoted(&rel)))?;
            layers.push((rel, String::new(), d));
        }
        let digest = Digest::of(config.as_bytes()).to_string();
        (layers, config, digest)
    } else {
        return Err("not an OCI layout nor a docker save archive".into());
    };
    // Every layer's bytes checked before any of them goes to the store.
    for (rel, _, d) in &layers {
        let actual = layers::digest_of(open(rel)?)
            .map_err(|e| format!("{} in the archive: {e}", layers::quoted(rel)))?;
        if actual != *d {
            return Err(format!(
                "layer {d} in the archive does not match its digest (its content hashes to {actual}); nothing was imported"
            )
            .into());
        }
    }
    let root = Arc::new(Dir::create(layers_root).map_err(|e| format!("the layer store: {e}"))?);
    let mut prep = Prepared::new(root.clone(), layers_root, workspace, digest);
    prep.defaults = defaults_of(&config);
    for (rel, media, d) in layers {
        let name = d.layer_name();
        if prep.has(&name) {
            prep.repeat(&d);
        } else if layers::is_ready(&root, &name, layers::VERIFIED) {
            let size = budget.size_in_store(&root, &name)?;
            prep.add(&d, None, true, size, budget)?;
        } else {
            let part = format!(".part-{}", crate::unique_suffix());
            prep.scratch.names.push(part.clone());
            unpack_part(
                &root,
                open(&rel)?,
                &media,
                &part,
                budget.left(prep.spent, &name),
            )
            .map_err(|e| e.prepare(budget.room))?;
            let size = layers::disk_bytes(&root.path().join(&part))
                .map_err(|e| format!("measuring the layer: {e}"))?;
            prep.add(&d, Some(part), true, size, budget)?;
        }
    }
    Ok(prep)
}

fn defaults_of(config: &str) -> ImageDefaults {
    let v: serde_json::Value = serde_json::from_str(config).unwrap_or_default();
    let c = &v["config"];
    let mut env = BTreeMap::new();
    for e in c["Env"].as_array().into_iter().flatten() {
        if let Some((k, val)) = e.as_str().and_then(|s| s.split_once('=')) {
            env.insert(k.to_string(), val.to_string());
        }
    }
    let workdir = c["WorkingDir"]
        .as_str()
        .filter(|w| w.starts_with('/'))
        .map(String::from);
    let user = c["User"].as_str().filter(|u| !u.is_empty()).map(|u| {
        if u == "0" || u == "root" || u.starts_with("0:") || u.starts_with("root:") {
            ExecUser::Root
        } else {
            ExecUser::User
        }
    });
    ImageDefaults { env, workdir, user }
}

/// Unpacks one verified layer blob into `part` (a new directory of the store), then installs
/// it as layer `name`, marked verified; answers the entry count.
#[cfg(test)]
fn unpack_layer(
    store: &Dir,
    f: std::fs::File,
    media_type: &str,
    part: &str,
    name: &str,
) -> Result<usize, String> {
    let count = unpack_part(store, f, media_type, part, u64::MAX).map_err(|e| match e {
        UnpackError::OverLimit => "over the limit".to_string(),
        UnpackError::Other(e) => e,
    })?;
    layers::install(store, part, name, layers::VERIFIED)
        .map_err(|e| format!("keeping the layer: {e}"))?;
    Ok(count)
}

/// Unpacks one verified layer blob into `part`, a new directory of the store, reading at most
/// `limit` bytes of its tar stream (decompressed: what it writes is no more); answers the
/// entry count.
fn unpack_part(
    store: &Dir,
    mut f: std::fs::File,
    media_type: &str,
    part: &str,
    limit: u64,
) -> Result<usize, UnpackError> {
    use std::io::Seek;
    let mut head = [0u8; 4];
    let n = f.read(&mut head).map_err(|e| e.to_string())?;
    f.rewind().map_err(|e| e.to_string())?;
    // The media type says how it is compressed; the first bytes say it too, and win.
    let reader: Box<dyn Read> = if n >= 2 && head[..2] == [0x1f, 0x8b] {
        Box::new(flate2::read::GzDecoder::new(f))
    } else if n >= 4 && head == [0x28, 0xb5, 0x2f, 0xfd] {
        Box::new(zstd::stream::read::Decoder::new(f).map_err(|e| e.to_string())?)
    } else if media_type.ends_with("+gzip") || media_type.ends_with("+zstd") {
        return Err(format!(
            "layer is not the {} it claims to be",
            layers::quoted(media_type)
        )
        .into());
    } else {
        Box::new(f)
    };
    store.mkdir(part).map_err(|e| e.to_string())?;
    let root = store.path().join(part);
    let over = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let capped = Capped {
        inner: reader,
        left: limit,
        over: over.clone(),
    };
    unpack_into(capped, &root).map_err(|e| {
        if over.load(std::sync::atomic::Ordering::Relaxed) {
            UnpackError::OverLimit
        } else {
            UnpackError::Other(e)
        }
    })
}

/// Why a layer was not unpacked.
#[derive(Debug)]
enum UnpackError {
    /// Its tar stream is longer than the limit.
    OverLimit,
    Other(String),
}

impl From<String> for UnpackError {
    fn from(s: String) -> Self {
        UnpackError::Other(s)
    }
}

impl UnpackError {
    /// As a pull or an import says it, with the room the budget had.
    fn prepare(self, room: u64) -> PrepareError {
        match self {
            UnpackError::OverLimit => PrepareError::OverQuota {
                needed: room.saturating_add(1),
                room,
            },
            UnpackError::Other(e) => PrepareError::Invalid(e),
        }
    }
}

/// A reader that fails once it has given `left` bytes.
struct Capped<R> {
    inner: R,
    left: u64,
    over: Arc<std::sync::atomic::AtomicBool>,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            self.over.store(true, std::sync::atomic::Ordering::Relaxed);
            return Err(std::io::Error::other(
                "the layer is larger than the room left",
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// Unpacks a layer's tar into `root`, whiteouts made overlayfs's; answers the entry count.
fn unpack_into(reader: impl Read, root: &Path) -> Result<usize, String> {
    let mut archive = tar::Archive::new(reader);
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(true);
    archive.set_unpack_xattrs(false);
    archive.set_overwrite(true);
    let mut count = 0;
    for entry in archive.entries().map_err(|e| e.to_string())? {
        let mut entry = entry.map_err(|e| format!("reading the layer: {e}"))?;
        let path = entry.path().map_err(|e| e.to_string())?.into_owned();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let parent = path.parent().unwrap_or(Path::new(""));
        if name == ".wh..wh..opq" {
            let d = safe_join(root, parent)?;
            std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
            xattr_set(&d, "trusted.overlay.opaque", b"y")?;
        } else if let Some(hidden) = name.strip_prefix(".wh.") {
            if hidden.is_empty() || hidden == "." || hidden == ".." {
                continue;
            }
            let d = safe_join(root, parent)?;
            std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
            whiteout(&d.join(hidden))?;
        } else {
            let kind = entry.header().entry_type();
            if kind.is_block_special() || kind.is_character_special() || kind.is_fifo() {
                continue; // devices come from the sandbox's own /dev, never from an image
            }
            entry.unpack_in(root).map_err(|e| {
                let cause = std::error::Error::source(&e)
                    .map(|c| format!(": {c}"))
                    .unwrap_or_default();
                format!("unpacking {}: {e}{cause}", path.display())
            })?;
        }
        count += 1;
    }
    Ok(count)
}

/// `root/rel`, refusing `..` and absolute parts.
fn safe_join(root: &Path, rel: &Path) -> Result<PathBuf, String> {
    let mut out = root.to_path_buf();
    for c in rel.components() {
        match c {
            std::path::Component::Normal(p) => out.push(p),
            std::path::Component::CurDir => {}
            _ => return Err(format!("layer entry {} leaves the layer", rel.display())),
        }
    }
    // Never through a symlink an earlier entry planted.
    let mut p = root.to_path_buf();
    for c in out.strip_prefix(root).unwrap_or(Path::new("")).components() {
        p.push(c);
        if std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(format!(
                "layer entry {} goes through a symlink",
                rel.display()
            ));
        }
    }
    Ok(out)
}

fn whiteout(p: &Path) -> Result<(), String> {
    let _ = std::fs::remove_file(p);
    nix::sys::stat::mknod(
        p,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o000),
        nix::sys::stat::makedev(0, 0),
    )
    .map_err(|e| format!("whiteout {}: {e}", p.display()))
}

fn xattr_set(p: &Path, name: &str, value: &[u8]) -> Result<(), String> {
    let cp = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    let cn = std::ffi::CString::new(name).map_err(|e| e.to_string())?;
    // SAFETY: NUL-terminated strings and a buffer we own.
    let r = unsafe {
        libc::lsetxattr(
            cp.as_ptr(),
            cn.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r != 0 {
        return Err(format!(
            "marking {} opaque: {}",
            p.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// The name of the skeleton layer (the server's own; charged to nobody).
pub const SKELETON: &str = "oci-skeleton-v1";

/// The layer every image-based template gets on top of the image: the mount points a sandbox
/// needs, the sandbox user's home, and the host's resolver settings.
pub fn skeleton(layers_root: &Path, resolv_conf: &str) -> Result<PathBuf, String> {
    const NAME: &str = SKELETON;
    let store = Dir::create(layers_root).map_err(|e| format!("the layer store: {e}"))?;
    if layers::is_ready(&store, NAME, layers::COMPLETE) {
        return Ok(layers_root.join(NAME).join("root"));
    }
    let part_name = format!(".part-{}", crate::unique_suffix());
    let part = layers_root.join(&part_name);
    let mk = |rel: &str, mode: u32| -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let p = part.join(rel);
        std::fs::create_dir_all(&p)?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))
    };
    let made = (|| -> std::io::Result<PathBuf> {
        store.mkdir(&part_name)?;
        for d in ["proc", "sys", "dev", "run", "etc", "home"] {
            mk(d, 0o755)?;
        }
        mk("tmp", 0o1777)?;
        mk("home/user", 0o755)?;
        std::os::unix::fs::chown(
            part.join("home/user"),
            Some(cella_runtime::rootfs::USER_UID),
            Some(cella_runtime::rootfs::USER_UID),
        )?;
        std::fs::write(part.join("etc/resolv.conf"), resolv_conf)?;
        layers::install(&store, &part_name, NAME, layers::COMPLETE)
    })();
    if made.is_err() {
        let _ = store.remove_all(&part_name);
    }
    made.map_err(|e| format!("making the skeleton layer: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_listed_registries_speak_http() {
        let regs = Registries {
            insecure: vec!["127.0.0.1:5000".into()],
            listen: None,
        };
        assert!(
            matches!(regs.protocol(), ClientProtocol::HttpsExcept(v) if v == ["127.0.0.1:5000"])
        );
    }

    #[tokio::test]
    async fn registries_on_internal_addresses_are_refused_unless_listed() {
        let regs = Registries {
            insecure: vec!["127.0.0.1:5000".into()],
            listen: Some("203.0.113.7:7070".parse().unwrap()),
        };
        check_registry("127.0.0.1:5000", &regs).await.unwrap();
        for bad in [
            "127.0.0.1:5001",
            "127.1.2.3",
            "localhost:5000",
            "10.1.2.3:443",
            "172.16.0.1",
            "192.168.1.1:5000",
            "100.64.0.1",
            "169.254.169.254",
            "0.0.0.0:80",
            "[::1]:5000",
            "[fe80::1]",
            "[fd00::1]:5000",
            "[::ffff:127.0.0.1]:5000",
            "[64:ff9b::a9fe:a9fe]",
            "203.0.113.7:5000",
        ] {
            let e = check_registry(bad, &regs).await.unwrap_err().to_string();
            assert!(
                e.contains("insecure_registries") && e.contains(bad),
                "{bad}: {e}"
            );
        }
        check_registry("8.8.8.8", &regs).await.unwrap();
        check_registry("[2001:4860:4860::8888]:443", &regs)
            .await
            .unwrap();
        assert_eq!(split_registry("[::1]:5000"), ("::1".to_string(), 5000));
        assert_eq!(split_registry("reg.example:80"), ("reg.example".into(), 80));
        assert_eq!(split_registry("reg.example"), ("reg.example".into(), 443));
    }

    /// Answers a public address to the first lookup, loopback to every later one, as a
    /// rebinding name does; counts lookups.
    struct Rebinding(std::sync::atomic::AtomicUsize);

    impl Lookup for Rebinding {
        fn lookup<'a>(
            &'a self,
            _host: &'a str,
            port: u16,
        ) -> futures_util::future::BoxFuture<'a, std::io::Result<Vec<SocketAddr>>> {
            let n = self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let ip: IpAddr = if n == 0 {
                "192.0.2.10".parse().unwrap()
            } else {
                "127.0.0.1".parse().unwrap()
            };
            Box::pin(async move { Ok(vec![SocketAddr::new(ip, port)]) })
        }
    }

    #[tokio::test]
    async fn a_rebinding_name_is_connected_to_on_the_address_that_was_checked() {
        // Real DNS rebinding cannot be staged here (no resolver of ours); the lookup is the
        // seam: each connection looks the name up once and gets the addresses it may dial.
        let regs = Registries::default();
        let dns = Rebinding(Default::default());
        let hop = Hop::Registry("rebind.test");
        let first = resolve_checked("rebind.test", 443, &hop, &regs, &dns)
            .await
            .unwrap();
        assert_eq!(first, vec!["192.0.2.10:443".parse().unwrap()]);
        assert_eq!(dns.0.load(std::sync::atomic::Ordering::SeqCst), 1);
        // The next connection sees the second answer, and is refused.
        let e = resolve_checked("rebind.test", 443, &hop, &regs, &dns)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rebind.test") && e.contains("127.0.0.1, a loopback address"),
            "{e}"
        );
        // Another host (a redirect's, a token service's) says so.
        let e = resolve_checked(
            "storage.test",
            443,
            &Hop::Elsewhere("storage.test:443".into()),
            &regs,
            &dns,
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("sent the pull on to storage.test:443")
                && e.contains("\"storage.test:443\" in the server's [images] insecure_registries"),
            "{e}"
        );
    }

    #[test]
    fn listed_registries_match_host_and_port() {
        let regs = Registries {
            insecure: vec![
                "127.0.0.1:5000".into(),
                "Reg.Internal".into(),
                "[::1]:5001".into(),
            ],
            listen: None,
        };
        assert!(regs.listed("127.0.0.1", 5000));
        assert!(!regs.listed("127.0.0.1", 5001));
        assert!(regs.listed("reg.internal", 80) && regs.listed("reg.internal", 443));
        assert!(!regs.listed("reg.internal", 5000));
        assert!(regs.listed("::1", 5001) && !regs.listed("::1", 5000));
    }

    #[test]
    fn registry_errors_never_carry_the_body() {
        let e = OciDistributionError::ServerError {
            code: 500,
            url: "http://x/v2/".into(),
            message: "SECRET BODY".into(),
        };
        assert_eq!(registry_error(&e), "the registry answered HTTP 500");
        let e = OciDistributionError::ManifestParsingError("SECRET BODY".into());
        assert!(!registry_error(&e).contains("SECRET"));
    }

    #[test]
    fn image_config_gives_env_workdir_and_user() {
        let d = defaults_of(
            r#"{"config":{"Env":["PATH=/usr/bin","A=b=c"],"WorkingDir":"/srv","User":"1000"}}"#,
        );
        assert_eq!(d.env["A"], "b=c");
        assert_eq!(d.workdir.as_deref(), Some("/srv"));
        assert_eq!(d.user, Some(ExecUser::User));
        assert_eq!(
            defaults_of(r#"{"config":{"User":"root"}}"#).user,
            Some(ExecUser::Root)
        );
        assert_eq!(defaults_of("{}"), ImageDefaults::default());
    }

    #[test]
    fn whiteouts_become_overlay_whiteouts_and_escapes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let blob = dir.path().join("layer.tar");
        {
            let mut b = tar::Builder::new(std::fs::File::create(&blob).unwrap());
            let mut add = |path: &str, data: &[u8]| {
                let mut h = tar::Header::new_gnu();
                h.set_size(data.len() as u64);
                h.set_mode(0o644);
                h.set_uid(0);
                h.set_gid(0);
                h.set_cksum();
                b.append_data(&mut h, path, data).unwrap();
            };
            add("etc/app.conf", b"x");
            add("etc/.wh.old.conf", b"");
            add("var/cache/.wh..wh..opq", b"");
            b.finish().unwrap();
        }
        let store = Dir::create(&dir.path().join("layers")).unwrap();
        let f = std::fs::File::open(&blob).unwrap();
        assert_eq!(
            unpack_layer(
                &store,
                f,
                "application/vnd.oci.image.layer.v1.tar",
                ".part-x",
                "l1"
            )
            .unwrap(),
            3
        );
        let out = dir.path().join("layers/l1");
        let root = out.join("root");
        assert_eq!(std::fs::read(root.join("etc/app.conf")).unwrap(), b"x");
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let wh = std::fs::symlink_metadata(root.join("etc/old.conf")).unwrap();
        assert!(wh.file_type().is_char_device() && wh.rdev() == 0);
        assert!(out.join(layers::VERIFIED).exists());
        assert!(!dir.path().join("layers/.part-x").exists());
        assert!(safe_join(&root, Path::new("../x")).is_err());
    }

    #[test]
    fn a_layer_that_unpacks_past_its_limit_stops_there() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let blob = dir.path().join("layer.tar.gz");
        {
            let gz = flate2::write::GzEncoder::new(
                std::fs::File::create(&blob).unwrap(),
                flate2::Compression::fast(),
            );
            let mut b = tar::Builder::new(gz);
            let data = vec![0u8; 8 << 20];
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_uid(0);
            h.set_gid(0);
            h.set_cksum();
            b.append_data(&mut h, "zeros", &data[..]).unwrap();
            b.into_inner().unwrap().finish().unwrap().flush().unwrap();
        }
        assert!(std::fs::metadata(&blob).unwrap().len() < 100_000);
        let store = Dir::create(&dir.path().join("layers")).unwrap();
        let f = || std::fs::File::open(&blob).unwrap();
        let e = unpack_part(&store, f(), "", ".part-a", 1 << 20).unwrap_err();
        assert!(matches!(e, UnpackError::OverLimit), "{e:?}");
        // Less than the limit and a bit was written before it stopped.
        let written = layers::disk_bytes(&dir.path().join("layers/.part-a")).unwrap();
        assert!(written < 2 << 20, "{written}");
        assert!(matches!(
            e.prepare(5),
            PrepareError::OverQuota { needed: 6, room: 5 }
        ));
        assert_eq!(unpack_part(&store, f(), "", ".part-b", 9 << 20).unwrap(), 1);
    }
}
