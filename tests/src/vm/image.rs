//! The guests' base image (built or found by `tests/vm/build-image.sh`, cached
//! outside the repository) and the choice of accelerator (KVM when it really
//! boots a kernel, otherwise TCG). It prepares; it starts no guest of a test.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncBufReadExt as _;

use crate::process::require_binary;

/// What installs the programs the VM harness needs on the test machine.
pub const INSTALL: &str = "apt-get install -y --no-install-recommends qemu-system-x86 qemu-utils cloud-image-utils debootstrap socat dpkg-dev apt-utils";

/// The base image: a raw ext4 root, and the kernel and initramfs from its `/boot`.
#[derive(Debug, Clone)]
pub struct Image {
    pub dir: PathBuf,
    pub base: PathBuf,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    /// Whether this call built it (false: it was in the cache).
    pub built: bool,
    /// How long this call took (a build, or finding it in the cache).
    pub took: Duration,
}

impl Image {
    /// Builds the image, or finds it in the cache (`JIO_VM_CACHE`, default
    /// `/var/cache/jiocloud-tests/vm`); waits for a build already going.
    pub async fn ensure() -> Image {
        for bin in ["debootstrap", "mkfs.ext4", "qemu-img"] {
            require_binary(bin, INSTALL);
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("vm/build-image.sh");
        let start = tokio::time::Instant::now();
        let out = tokio::process::Command::new(&script)
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .await
            .expect("run tests/vm/build-image.sh");
        let took = start.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "tests/vm/build-image.sh failed ({}):\n{stderr}",
            out.status
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let dir = PathBuf::from(stdout.lines().last().expect("the image's directory").trim());
        let image = Image {
            base: dir.join("base.img"),
            kernel: dir.join("vmlinuz"),
            initrd: dir.join("initrd.img"),
            built: stderr.contains("built VM image"),
            dir,
            took,
        };
        for f in [&image.base, &image.kernel, &image.initrd] {
            assert!(f.is_file(), "{} is missing from the image", f.display());
        }
        println!(
            "vm: image {} {} in {:.1} s",
            image.dir.display(),
            if image.built {
                "built"
            } else {
                "found in the cache"
            },
            took.as_secs_f64()
        );
        image
    }

    /// The image's build record (`build.txt`: its key, size, build seconds).
    pub fn record(&self) -> String {
        std::fs::read_to_string(self.dir.join("build.txt")).unwrap_or_default()
    }
}

/// How QEMU runs the guests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    Kvm,
    Tcg,
}

impl Accel {
    /// QEMU's arguments for this accelerator.
    pub fn args(self) -> &'static [&'static str] {
        match self {
            Accel::Kvm => &["-accel", "kvm", "-cpu", "host"],
            // QEMU's default translation cache (1 GiB) would triple a guest's
            // resident memory.
            Accel::Tcg => &["-accel", "tcg,tb-size=256"],
        }
    }

    /// KVM if `/dev/kvm` opens and a kernel really starts under it within 15 s
    /// (nested KVM may abort at once, `failed to set MSR`, or hang before the
    /// kernel prints anything); otherwise TCG. `JIO_VM_ACCEL=kvm|tcg` decides instead.
    pub async fn detect(image: &Image) -> Accel {
        match std::env::var("JIO_VM_ACCEL").as_deref() {
            Ok("kvm") => return Accel::Kvm,
            Ok("tcg") => return Accel::Tcg,
            _ => {}
        }
        let openable = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .is_ok();
        let (accel, why) = if !openable {
            (Accel::Tcg, "/dev/kvm cannot be opened".to_string())
        } else {
            match kvm_boots(image).await {
                Ok(()) => (Accel::Kvm, "a kernel boots under KVM".to_string()),
                Err(why) => (Accel::Tcg, why),
            }
        };
        println!("vm: accelerator {accel:?} ({why})");
        accel
    }
}

/// Boots the image's kernel alone under KVM until it prints its banner.
async fn kvm_boots(image: &Image) -> Result<(), String> {
    let qemu = require_binary("qemu-system-x86_64", INSTALL);
    let mut child = tokio::process::Command::new(qemu)
        .args(Accel::Kvm.args())
        .args(["-nodefaults", "-no-user-config", "-display", "none", "-m", "256"])
        .args(["-serial", "stdio", "-no-reboot", "-kernel"])
        .arg(&image.kernel)
        .args(["-append", "console=ttyS0 panic=-1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("QEMU does not start: {e}"))?;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let banner = tokio::time::timeout(Duration::from_secs(15), async {
        while let Ok(Some(l)) = lines.next_line().await {
            if l.contains("Linux version") {
                return true;
            }
        }
        false
    })
    .await;
    let _ = child.start_kill();
    let out = child.wait_with_output().await.map_err(|e| e.to_string())?;
    match banner {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!(
            "KVM does not work here: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .next()
                .unwrap_or("QEMU ended")
        )),
        Err(_) => Err("KVM does not work here: no kernel banner within 15 s".into()),
    }
}
