//! OCI images as template bases: pull from a registry (anonymous, or basic auth; manifest lists
//! resolved to this machine's platform), unpack each layer once into the layer store, and turn
//! the image's whiteouts into overlayfs's own (a `.wh.<name>` entry becomes a 0/0 character
//! device, `.wh..wh..opq` the directory's `trusted.overlay.opaque` attribute), so the layers
//! stack under overlayfs exactly as the image says.
//!
//! The registry protocol is `oci-client`'s (a maintained crate: auth flows, manifest lists,
//! digest checks); unpacking is the `tar` crate's, which refuses entries that would land
//! outside the layer directory. Layers are kept by digest under `DATA/layers/oci-<digest>`, so
//! images that share layers share them on disk.

use cella_types::{ExecUser, RegistryAuth};
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth as Auth;
use oci_client::{Client, Reference};
use sha2::Digest;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

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

fn registry_host(reference: &Reference) -> String {
    reference.resolve_registry().to_string()
}

/// Registries on this machine's loopback speak plain HTTP; every other one HTTPS.
fn protocol_for(registry: &str) -> ClientProtocol {
    let host = registry
        .rsplit_once(':')
        .map(|(h, _)| h)
        .unwrap_or(registry);
    if host == "localhost" || host.starts_with("127.") || host == "[::1]" {
        ClientProtocol::HttpsExcept(vec![registry.to_string()])
    } else {
        ClientProtocol::Https
    }
}

/// Pulls `image` and unpacks its layers under `layers_root`; `log` hears of each layer.
pub async fn pull(
    image: &str,
    auth: Option<&RegistryAuth>,
    layers_root: &Path,
    mut log: impl FnMut(String),
) -> Result<Pulled, String> {
    let reference: Reference = image
        .parse()
        .map_err(|e| format!("{image:?} is not an image reference: {e}"))?;
    let client = Client::new(ClientConfig {
        protocol: protocol_for(&registry_host(&reference)),
        ..Default::default()
    });
    let auth = match auth {
        Some(a) => Auth::Basic(a.username.clone(), a.password.clone()),
        None => Auth::Anonymous,
    };
    let (manifest, digest, config) = client
        .pull_manifest_and_config(&reference, &auth)
        .await
        .map_err(|e| format!("pulling {image}: {e}"))?;
    log(format!(
        "  image {image} ({digest}), {} layer(s)\n",
        manifest.layers.len()
    ));
    let mut layers = Vec::new();
    for layer in &manifest.layers {
        let name = format!("oci-{}", layer.digest.replace(':', "-"));
        let dir = layers_root.join(&name);
        if dir.join("complete").exists() {
            log(format!("  layer {} (cached)\n", short(&layer.digest)));
        } else {
            let tmp = layers_root.join(format!("{name}.download"));
            let mut file = tokio::fs::File::create(&tmp)
                .await
                .map_err(|e| format!("layer file: {e}"))?;
            client
                .pull_blob(&reference, layer, &mut file)
                .await
                .map_err(|e| format!("pulling layer {}: {e}", layer.digest))?;
            drop(file);
            let (media, dir2, tmp2) = (layer.media_type.clone(), dir.clone(), tmp.clone());
            let size = tokio::task::spawn_blocking(move || unpack(&tmp2, &media, &dir2))
                .await
                .map_err(|e| e.to_string())??;
            let _ = tokio::fs::remove_file(&tmp).await;
            log(format!(
                "  layer {} unpacked ({size} files)\n",
                short(&layer.digest)
            ));
        }
        layers.push(dir.join("root"));
    }
    layers.reverse();
    Ok(Pulled {
        digest,
        layers,
        defaults: defaults_of(&config),
    })
}

/// Imports an image from an archive on this host: an OCI layout (`oci-layout`, `index.json`,
/// `blobs/`) or a `docker save` tarball (`manifest.json`), as a tar file. Its layers go to the
/// layer store like pulled ones; `work` is an empty scratch directory.
pub fn import_archive(archive: &Path, layers_root: &Path, work: &Path) -> Result<Pulled, String> {
    let f = std::fs::File::open(archive).map_err(|e| e.to_string())?;
    let mut a = tar::Archive::new(f);
    a.set_preserve_permissions(false);
    a.unpack(work)
        .map_err(|e| format!("reading the archive: {e}"))?;
    std::fs::create_dir_all(layers_root).map_err(|e| e.to_string())?;
    let json = |p: &Path| -> Result<serde_json::Value, String> {
        let b = std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?;
        serde_json::from_slice(&b).map_err(|e| format!("{}: {e}", p.display()))
    };
    let blob = |digest: &str| -> Result<PathBuf, String> {
        let (algo, hex) = digest
            .split_once(':')
            .ok_or("a digest without an algorithm")?;
        if algo != "sha256" || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(format!("unsupported digest {digest}"));
        }
        Ok(work.join("blobs").join(algo).join(hex))
    };
    // (layer file, media type, digest) bottom first, the config, and the image's digest.
    let (layers, config, digest): (Vec<(PathBuf, String, String)>, String, String) =
        if work.join("oci-layout").exists() {
            let index = json(&work.join("index.json"))?;
            let mut desc = index["manifests"][0].clone();
            // An index inside: this machine's platform, else the first entry.
            while desc["mediaType"]
                .as_str()
                .is_some_and(|m| m.contains("index") || m.contains("manifest.list"))
            {
                let inner = json(&blob(desc["digest"].as_str().unwrap_or(""))?)?;
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
            let digest = desc["digest"]
                .as_str()
                .ok_or("no manifest in index.json")?
                .to_string();
            let manifest = json(&blob(&digest)?)?;
            let config =
                std::fs::read_to_string(blob(manifest["config"]["digest"].as_str().unwrap_or(""))?)
                    .map_err(|e| e.to_string())?;
            let layers = manifest["layers"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|l| {
                    let d = l["digest"].as_str().unwrap_or("").to_string();
                    Ok((
                        blob(&d)?,
                        l["mediaType"].as_str().unwrap_or("").to_string(),
                        d,
                    ))
                })
                .collect::<Result<Vec<_>, String>>()?;
            (layers, config, digest)
        } else if work.join("manifest.json").exists() {
            let m = json(&work.join("manifest.json"))?;
            let first = &m[0];
            let rel = |p: &str| -> Result<PathBuf, String> {
                let p = Path::new(p);
                if p.components()
                    .any(|c| !matches!(c, std::path::Component::Normal(_)))
                {
                    return Err(format!("{} leaves the archive", p.display()));
                }
                Ok(work.join(p))
            };
            let cfg_path = rel(first["Config"]
                .as_str()
                .ok_or("manifest.json names no config")?)?;
            let config = std::fs::read_to_string(&cfg_path).map_err(|e| e.to_string())?;
            let mut layers = Vec::new();
            for l in first["Layers"].as_array().into_iter().flatten() {
                let p = rel(l.as_str().unwrap_or(""))?;
                let bytes = std::fs::read(&p).map_err(|e| e.to_string())?;
                let d = format!("sha256:{}", hex::encode(sha2::Sha256::digest(&bytes)));
                layers.push((p, String::new(), d));
            }
            let digest = format!(
                "sha256:{}",
                hex::encode(sha2::Sha256::digest(config.as_bytes()))
            );
            (layers, config, digest)
        } else {
            return Err("not an OCI layout nor a docker save archive".into());
        };
    let mut out = Vec::new();
    for (file, media, d) in layers {
        let dir = layers_root.join(format!("oci-{}", d.replace(':', "-")));
        if !dir.join("complete").exists() {
            unpack(&file, &media, &dir)?;
        }
        out.push(dir.join("root"));
    }
    out.reverse();
    Ok(Pulled {
        digest,
        layers: out,
        defaults: defaults_of(&config),
    })
}

fn short(digest: &str) -> &str {
    let d = digest.split(':').nth(1).unwrap_or(digest);
    &d[..d.len().min(12)]
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

/// Unpacks one layer blob into `dir/root` (then marks it complete); answers the entry count.
fn unpack(blob: &Path, media_type: &str, dir: &Path) -> Result<usize, String> {
    let mut head = [0u8; 4];
    let mut f = std::fs::File::open(blob).map_err(|e| e.to_string())?;
    let n = f.read(&mut head).map_err(|e| e.to_string())?;
    let f = std::fs::File::open(blob).map_err(|e| e.to_string())?;
    // The media type says how it is compressed; the first bytes say it too, and win.
    let reader: Box<dyn Read> = if n >= 2 && head[..2] == [0x1f, 0x8b] {
        Box::new(flate2::read::GzDecoder::new(f))
    } else if n >= 4 && head == [0x28, 0xb5, 0x2f, 0xfd] {
        Box::new(zstd::stream::read::Decoder::new(f).map_err(|e| e.to_string())?)
    } else if media_type.ends_with("+gzip") || media_type.ends_with("+zstd") {
        return Err(format!("layer is not the {media_type} it claims to be"));
    } else {
        Box::new(f)
    };
    let root = dir.join("root.part");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).map_err(|e| e.to_string())?;
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
            let d = safe_join(&root, parent)?;
            std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
            xattr_set(&d, "trusted.overlay.opaque", b"y")?;
        } else if let Some(hidden) = name.strip_prefix(".wh.") {
            let d = safe_join(&root, parent)?;
            std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
            whiteout(&d.join(hidden))?;
        } else {
            let kind = entry.header().entry_type();
            if kind.is_block_special() || kind.is_character_special() || kind.is_fifo() {
                continue; // devices come from the sandbox's own /dev, never from an image
            }
            entry.unpack_in(&root).map_err(|e| {
                let cause = std::error::Error::source(&e)
                    .map(|c| format!(": {c}"))
                    .unwrap_or_default();
                format!("unpacking {}: {e}{cause}", path.display())
            })?;
        }
        count += 1;
    }
    let _ = std::fs::remove_dir_all(dir.join("root"));
    std::fs::rename(&root, dir.join("root")).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("complete"), b"").map_err(|e| e.to_string())?;
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

/// The layer every image-based template gets on top of the image: the mount points a sandbox
/// needs, the sandbox user's home, and the host's resolver settings.
pub fn skeleton(layers_root: &Path, resolv_conf: &str) -> Result<PathBuf, String> {
    let dir = layers_root.join("oci-skeleton-v1");
    let root = dir.join("root");
    if dir.join("complete").exists() {
        return Ok(root);
    }
    let part = dir.join("root.part");
    let _ = std::fs::remove_dir_all(&part);
    let mk = |rel: &str, mode: u32| -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let p = part.join(rel);
        std::fs::create_dir_all(&p)?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))
    };
    (|| -> std::io::Result<()> {
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
        Ok(())
    })()
    .map_err(|e| format!("making the skeleton layer: {e}"))?;
    let _ = std::fs::remove_dir_all(&root);
    std::fs::rename(&part, &root).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("complete"), b"").map_err(|e| e.to_string())?;
    Ok(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_registries_speak_http() {
        assert!(
            matches!(protocol_for("127.0.0.1:5000"), ClientProtocol::HttpsExcept(v) if v == ["127.0.0.1:5000"])
        );
        assert!(matches!(
            protocol_for("localhost:5000"),
            ClientProtocol::HttpsExcept(_)
        ));
        assert!(matches!(
            protocol_for("registry.example.com"),
            ClientProtocol::Https
        ));
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
        let out = dir.path().join("l1");
        assert_eq!(
            unpack(&blob, "application/vnd.oci.image.layer.v1.tar", &out).unwrap(),
            3
        );
        let root = out.join("root");
        assert_eq!(std::fs::read(root.join("etc/app.conf")).unwrap(), b"x");
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let wh = std::fs::symlink_metadata(root.join("etc/old.conf")).unwrap();
        assert!(wh.file_type().is_char_device() && wh.rdev() == 0);
        assert!(out.join("complete").exists());
        assert!(safe_join(&root, Path::new("../x")).is_err());
    }
}
