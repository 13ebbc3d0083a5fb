//! One QEMU guest: its qcow2 overlay on the base image, its seed, its console, and
//! the QEMU process (direct kernel boot from the image's own kernel, so a guest
//! reboot boots the same way; user networking with `restrict=on`, so nothing leaves
//! the machine but the forwards to the test's loopback servers). Killed on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::SystemTime;

use crate::process::{kill, require_binary, spawn_tied};
use crate::vm::console::{self, Console};
use crate::vm::image::{Accel, INSTALL, Image};

/// The guest address its forwards listen on.
pub const HOST_ADDR: &str = "10.0.2.100";

/// A forward of `HOST_ADDR:guest_port` in every guest to `127.0.0.1:host_port`.
#[derive(Debug, Clone, Copy)]
pub struct Forward {
    pub guest_port: u16,
    pub host_port: u16,
}

/// How a guest is started.
#[derive(Debug, Clone)]
pub struct Machine {
    pub accel: Accel,
    pub memory_mb: u32,
    pub forwards: Vec<Forward>,
}

/// A running (or killed) guest.
pub struct Guest {
    pub name: String,
    pub console: Console,
    /// When QEMU was started (host clock).
    pub started: SystemTime,
    child: Option<Child>,
    pid: u32,
    overlay: PathBuf,
}

impl Guest {
    /// Creates the overlay in `dir` and starts QEMU with the seed `seed`; its
    /// console goes to `<logs>/<name>.console.log`.
    pub fn start(
        image: &Image,
        machine: &Machine,
        name: &str,
        seed: &Path,
        dir: &Path,
        logs: &Path,
    ) -> Guest {
        let overlay = dir.join(format!("{name}.qcow2"));
        let out = Command::new(require_binary("qemu-img", INSTALL))
            .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
            .arg(&image.base)
            .arg(&overlay)
            .output()
            .expect("run qemu-img");
        assert!(
            out.status.success(),
            "qemu-img create: {}",
            crate::inspect::text(&out)
        );
        let mut cmd = qemu_command(image, machine, name, seed, &overlay);
        let started = console::now();
        let mut child = spawn_tied(&mut cmd).expect("start qemu-system-x86_64");
        let stdout = child.stdout.take().expect("QEMU's stdout");
        let console = Console::capture(name, stdout, &logs.join(format!("{name}.console.log")));
        Guest {
            name: name.to_string(),
            console,
            started,
            pid: child.id(),
            child: Some(child),
            overlay,
        }
    }

    /// QEMU's process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// SIGKILLs QEMU (the guest is gone at once, as if its machine lost power).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill(&mut c);
        }
    }

    /// Whether QEMU still runs.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// QEMU's resident memory now and at its peak, in MiB (`VmRSS`, `VmHWM`).
    pub fn memory_mb(&self) -> Option<(u64, u64)> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .map(|kb| kb / 1024)
        };
        Some((field("VmRSS:")?, field("VmHWM:")?))
    }

    /// The size of the overlay file (what the guest wrote), in MiB.
    pub fn overlay_mb(&self) -> u64 {
        std::fs::metadata(&self.overlay).map_or(0, |m| m.len() / (1024 * 1024))
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        self.kill();
    }
}

fn qemu_command(image: &Image, machine: &Machine, name: &str, seed: &Path, overlay: &Path) -> Command {
    let mut netdev = "user,id=n0,restrict=on".to_string();
    let socat = require_binary("socat", INSTALL);
    for f in &machine.forwards {
        // One socat per connection, to the test's server on the loopback.
        netdev.push_str(&format!(
            ",guestfwd=tcp:{HOST_ADDR}:{}-cmd:{} - TCP:127.0.0.1:{}",
            f.guest_port,
            socat.display(),
            f.host_port
        ));
    }
    let mut cmd = Command::new(require_binary("qemu-system-x86_64", INSTALL));
    cmd.args(["-name", name, "-nodefaults", "-no-user-config", "-machine", "pc"])
        .args(machine.accel.args())
        .args(["-m", &machine.memory_mb.to_string(), "-smp", "1"])
        .args(["-display", "none", "-serial", "stdio", "-monitor", "none"])
        .arg("-kernel")
        .arg(&image.kernel)
        .arg("-initrd")
        .arg(&image.initrd)
        .args([
            "-append",
            "console=ttyS0 root=/dev/vda rw ds=nocloud net.ifnames=0 panic=-1",
        ])
        .arg("-drive")
        .arg(format!(
            "file={},if=virtio,format=qcow2,cache=unsafe",
            overlay.display()
        ))
        .arg("-drive")
        .arg(format!(
            "file={},if=virtio,format=raw,readonly=on",
            seed.display()
        ))
        .args(["-netdev", &netdev, "-device", "virtio-net-pci,netdev=n0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    cmd
}
