//! The embedded scheduler's dispatch cost, for bench/rust.py: `bench_core [PAIRS]`.
//!
//! The same measurement as bench/core_dispatch.py makes of the Python core: a fair pool filled to
//! the backlog with tasks spread at random over the tenants, then submit + dispatch(limit 1) pairs
//! timed with the backlog held steady (the dispatched tasks are finished between timed batches;
//! ids are made outside the timings). Best of 3 runs, in CPU time. Prints one JSON line per row:
//! ns per pair.

use cronoq::core::{Core, NewTask, PoolSettings};

const NOW: f64 = 0.0;

/// CPU seconds this process has used: CPU time, as bench/core_dispatch.py measures the Python core,
/// so that other work on a shared machine does not count.
fn cpu_now() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// A small deterministic generator (xorshift), so the tenants drawn are the same on every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

fn task(id: String, tenant: &str) -> NewTask {
    NewTask {
        id,
        pool: "p".into(),
        tenant: Some(tenant.to_string()),
        priority: 2,
        deadline: None,
        not_before: None,
        attempts: 0,
        cost: None,
    }
}

fn row(backlog: usize, tenants: usize, pairs: usize, fair: bool) -> f64 {
    let pool = PoolSettings { name: "p".into(), fair_share: fair, ..PoolSettings::default() };
    let mut core = Core::new(&[pool]).unwrap();
    let names: Vec<String> = (0..tenants).map(|i| format!("tenant-{i}")).collect();
    let mut rng = Rng(0x9e3779b97f4a7c15);
    for i in 0..backlog {
        core.submit(task(format!("q{i}"), &names[rng.below(tenants)]), NOW).unwrap();
    }
    core.add_worker("bench", &["p"], u32::MAX).unwrap();
    let mut next = 0u64;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let mut spent = 0.0;
        let mut done = 0;
        while done < pairs {
            let m = (pairs - done).min(2000);
            let batch: Vec<NewTask> = (0..m)
                .map(|_| {
                    next += 1;
                    task(format!("n{next}"), &names[rng.below(tenants)])
                })
                .collect();
            let mut out = Vec::with_capacity(m);
            let t0 = cpu_now();
            for t in batch {
                core.submit(t, NOW).unwrap();
                out.extend(core.dispatch(NOW, Some(1)));
            }
            spent += cpu_now() - t0;
            for a in out {
                core.finish(&a.task, &a.worker, a.attempt, NOW, None).unwrap();
                core.grant("bench", 1);
            }
            done += m;
        }
        best = best.min(spent / pairs as f64);
    }
    assert_eq!(core.counts("p").unwrap().0, backlog, "the backlog drifted");
    best
}

fn main() {
    let pairs: usize = std::env::args().nth(1).map_or(100_000, |p| p.parse().expect("PAIRS"));
    let rows = [
        (1_000, 1_000, true),
        (10_000, 1_000, true),
        (100_000, 1_000, true),
        (1_000_000, 1_000, true),
        (100_000, 10_000, true),
        (100_000, 100_000, true),
        (100_000, 1_000, false),
    ];
    for (backlog, tenants, fair) in rows {
        let ns = row(backlog, tenants, pairs, fair) * 1e9;
        println!("{{\"backlog\": {backlog}, \"tenants\": {tenants}, \"fair\": {fair}, \"ns_per_pair\": {ns:.1}}}");
    }
}
