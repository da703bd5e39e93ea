//! The embedded scheduler's dispatch cost, for bench/rust.py: `bench_core [PAIRS] [SHARE_BY]`.
//!
//! The same measurement as bench/core_dispatch.py makes of the Python core: a fair pool filled to
//! the backlog with tasks spread at random over the tenants, then submit + dispatch(limit 1) pairs
//! timed with the backlog held steady (the dispatched tasks are finished between timed batches;
//! ids are made outside the timings). Best of 3 runs, in CPU time. Prints one JSON line per row:
//! ns per pair. With SHARE_BY (`dispatches`, `cost` or `runtime`) the fair rows share by it, each
//! task costing 1 to 4, and each row says which.

use cronoq::core::{Core, NewTask, PoolSettings, ShareBy};

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

fn task(id: String, tenant: &str, cost: Option<f64>) -> NewTask {
    NewTask {
        id,
        pool: "p".into(),
        tenant: Some(tenant.to_string()),
        priority: 2,
        deadline: None,
        not_before: None,
        attempts: 0,
        cost,
    }
}

fn row(backlog: usize, tenants: usize, pairs: usize, fair: bool, share_by: Option<ShareBy>) -> f64 {
    let share_by = if fair { share_by.unwrap_or_default() } else { ShareBy::Dispatches };
    let pool = PoolSettings { name: "p".into(), fair_share: fair, share_by, ..PoolSettings::default() };
    let cost = |rng: &mut Rng| (share_by != ShareBy::Dispatches).then(|| 1.0 + rng.below(4) as f64);
    let mut core = Core::new(&[pool]).unwrap();
    let names: Vec<String> = (0..tenants).map(|i| format!("tenant-{i}")).collect();
    let mut rng = Rng(0x9e3779b97f4a7c15);
    for i in 0..backlog {
        let tenant = &names[rng.below(tenants)];
        core.submit(task(format!("q{i}"), tenant, cost(&mut rng)), NOW).unwrap();
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
                    let tenant = &names[rng.below(tenants)];
                    task(format!("n{next}"), tenant, cost(&mut rng))
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
    let share_by = std::env::args().nth(2).map(|s| ShareBy::parse(&s).expect("SHARE_BY"));
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
        let ns = row(backlog, tenants, pairs, fair, share_by) * 1e9;
        let mode = share_by.map(|s| format!(", \"share_by\": \"{}\"", s.as_str())).unwrap_or_default();
        println!(
            "{{\"backlog\": {backlog}, \"tenants\": {tenants}, \"fair\": {fair}{mode}, \"ns_per_pair\": {ns:.1}}}"
        );
    }
}
