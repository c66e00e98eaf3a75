//! Ports for the servers that tests and benchmarks start on loopback, and may start again on
//! the same port (a node after a kill, a PostgreSQL server after a restart).
//!
//! A port from `bind(0)` lies in the kernel's ephemeral range, which every outgoing connection
//! on the machine draws its local port from: while a server is down for a restart, a client
//! connection (a `psql`, a node's connection to its source, an S3 request) may take the port,
//! and the server cannot bind it again ("Address already in use"). These ports lie below that
//! range, where no connection takes one unless asked.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

/// Where this process takes ports from next (an offset in the window; `u32::MAX`: not yet).
static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);

/// The lowest port of the kernel's ephemeral range (32768 where it cannot be read).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768)
}

/// The most ports one call takes below the ephemeral range.
const MOST: u16 = 256;
/// The lowest port handed out below the ephemeral range.
const LOW: u16 = 10_000;

/// How many first ports there are below the ephemeral range, which starts at `high`; `None`
/// where there is no room. One window whatever a call's size: the calls' ranges, consecutive
/// in `NEXT`, stay apart after it wraps too (a window per size moved them by the difference in
/// size, so a small range after a wrap fell inside a larger one taken just before).
fn window(high: u16) -> Option<u32> {
    (high >= LOW + 1_000 + MOST).then(|| u32::from(high - MOST - LOW))
}

/// `n` consecutive loopback ports, each free now, below the ephemeral range (up to 256 of
/// them); the first is returned. Each call in a process gets new ones; processes start at
/// different places.
pub fn free_ports(n: u16) -> u16 {
    // More than a window's margin, or no room below the ephemeral range: take what bind(0)
    // gives.
    let Some(window) = window(ephemeral_low()).filter(|_| n <= MOST) else {
        return bind_any(n);
    };
    if NEXT.load(Ordering::Relaxed) == u32::MAX {
        let seed = std::process::id().wrapping_mul(2_654_435_761)
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
        let _ = NEXT.compare_exchange(
            u32::MAX,
            seed % window,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }
    for _ in 0..window {
        let offset = NEXT.fetch_add(u32::from(n) + 1, Ordering::Relaxed) % window;
        let first = LOW + offset as u16;
        if (first..first + n).all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            return first;
        }
    }
    bind_any(n)
}

/// `n` consecutive free ports starting at one `bind(0)` gives.
fn bind_any(n: u16) -> u16 {
    loop {
        let p = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a loopback port")
            .port();
        if p <= u16::MAX - n && (1..n).all(|i| TcpListener::bind(("127.0.0.1", p + i)).is_ok()) {
            return p;
        }
    }
}

/// One free port (see [`free_ports`]).
pub fn free_port() -> u16 {
    free_ports(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test at a time moves this process's ports.
    static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn ranges_of_any_size_stay_apart_where_the_window_wraps() {
        let high = ephemeral_low();
        let Some(window) = window(high) else {
            return; // bind(0) gives them here
        };
        let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
        // Start just before the wrap, and go past where a window of any size would wrap;
        // sizes as a cluster test asks for them (a member's 7, then a server's 1 or 2).
        NEXT.store(window - 9, Ordering::Relaxed);
        let mut seen = std::collections::HashSet::new();
        for n in [7, 1, 2, 7, 1, 7, 2, 4, 1, 7].repeat(3) {
            let first = free_ports(n);
            for p in first..first + n {
                assert!(p < high, "{p} is in the ephemeral range");
                assert!(seen.insert(p), "{p} was given twice");
            }
        }
    }

    #[test]
    fn ports_are_free_distinct_and_below_the_ephemeral_range() {
        let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
        let high = ephemeral_low();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..50 {
            let first = free_ports(4);
            for p in first..first + 4 {
                assert!(
                    p < high || window(high).is_none(),
                    "{p} is in the ephemeral range"
                );
                assert!(seen.insert(p), "{p} was given twice");
                TcpListener::bind(("127.0.0.1", p)).unwrap();
            }
        }
    }
}
