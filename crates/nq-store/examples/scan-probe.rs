//! `scan-probe`: where the resident memory of a full scan of a store goes.
//!
//! Opens a stopped run's data directory, walks it the way nq's full scans do
//! (each tree on its own, then the merged [`Store::scan_jobs`] of the audit,
//! the restart's check and the re-judging), holding nothing of what it reads,
//! and after each pass prints one line of figures:
//!
//! * `rss_mib` / `hwm_mib`: the process's `VmRSS` and `VmHWM`;
//! * `heap_used_mib`: bytes glibc's malloc has handed out from its arenas
//!   and not had back (`mallinfo2().uordblks`). This probe keeps nothing, so
//!   what grows here is held by sled: its page cache, its page table, and
//!   the pages it has replaced but not yet freed (sled frees them through
//!   crossbeam-epoch, later);
//! * `mmap_mib`: large blocks malloc took straight from the system
//!   (`hblkhd`), such as sled's write buffers: resident only as far as they
//!   were touched;
//! * `heap_free_mib`: freed bytes that malloc keeps in its arenas
//!   (`fordblks`): resident, but nobody's;
//! * `rss_after_trim_mib`: `VmRSS` after `malloc_trim(0)`, which hands free
//!   arena pages back to the system. The drop is the allocator's share.
//!
//! After the passes it closes the store and prints the same figures again:
//! what sled held is then free.
//!
//! The allocator is tuned as `nq-coord` tunes it (2 arenas, 1 MiB mmap
//! threshold) unless `--no-tune`. glibc on Linux only.
//!
//! ```text
//! cargo run --release -p nq-store --example scan-probe -- --data DIR --cache-mib 16
//! ```

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use nq_store::{Scan, Store, StoreOptions};

/// Measures where the resident memory of a full scan of a store goes.
#[derive(Debug, Parser)]
struct Args {
    /// The data directory of a stopped run (opened read-write by sled, but
    /// nothing is written).
    #[arg(long)]
    data: PathBuf,
    /// sled's `cache_capacity`, in MiB.
    #[arg(long, default_value_t = 16)]
    cache_mib: u64,
    /// Which passes, in order, comma-separated: `jobs`, `records`,
    /// `duplicates` (one tree each), `every` and `done` (the merged scans of
    /// `Store::scan_jobs`), `settle` (a million reads of one small value).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "jobs,records,duplicates,every"
    )]
    passes: Vec<String>,
    /// Leave glibc's malloc untuned (nq-coord and nq tune it: 2 arenas, a
    /// 1 MiB mmap threshold).
    #[arg(long)]
    no_tune: bool,
    /// Exit after the passes without closing the store, so that a heap
    /// profiler's report of memory not freed at exit (`heaptrack`) is what
    /// the open store holds.
    #[arg(long)]
    exit_open: bool,
    /// Trim the heap (`malloc_trim(0)`) after every this many entries of a
    /// pass, to see how much of the peak the allocator's free pages are.
    #[arg(long)]
    trim_every: Option<u64>,
    /// Instead of measuring, remove the stored summary of a finished run
    /// (run it on a copy): the coordinator then resumes the directory as one
    /// killed just before it wrote the summary, serves at once, checks every
    /// stored copy in the background and finishes again. That is how a
    /// restart's background check over a large store is measured without a
    /// load test's hour.
    #[arg(long)]
    forget_summary: bool,
}

/// glibc's `struct mallinfo2` (malloc.h, glibc 2.33+): ten `size_t`s.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct MallInfo2 {
    arena: usize,
    ordblks: usize,
    smblks: usize,
    hblks: usize,
    hblkhd: usize,
    usmblks: usize,
    fsmblks: usize,
    uordblks: usize,
    fordblks: usize,
    keepcost: usize,
}

unsafe extern "C" {
    fn mallinfo2() -> MallInfo2;
    fn malloc_trim(pad: usize) -> i32;
    fn mallopt(param: i32, value: i32) -> i32;
}

/// One reading of the process's memory.
#[derive(Debug, Clone, Copy)]
struct Reading {
    rss: u64,
    hwm: u64,
    used: u64,
    mmap: u64,
    free: u64,
}

const MIB: f64 = 1024.0 * 1024.0;

/// A `VmRSS:`-style field of `/proc/self/status`, in bytes.
fn status_field(name: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kb| kb * 1024)
}

fn read() -> Reading {
    // SAFETY: `mallinfo2` only reads the allocator's counters.
    let m = unsafe { mallinfo2() };
    Reading {
        rss: status_field("VmRSS:"),
        hwm: status_field("VmHWM:"),
        used: m.uordblks as u64,
        mmap: m.hblkhd as u64,
        free: m.fordblks as u64,
    }
}

fn trim() {
    // SAFETY: `malloc_trim` only returns free memory to the system.
    unsafe {
        malloc_trim(0);
    }
}

fn print(stage: &str, entries: u64, secs: f64, r: Reading, after_trim: u64) {
    println!(
        "{stage:<12} entries={entries:<11} secs={secs:<7.1} rss_mib={:<7.0} hwm_mib={:<7.0} \
         heap_used_mib={:<7.0} mmap_mib={:<5.0} heap_free_mib={:<7.0} \
         rss_after_trim_mib={:.0}",
        r.rss as f64 / MIB,
        r.hwm as f64 / MIB,
        r.used as f64 / MIB,
        r.mmap as f64 / MIB,
        r.free as f64 / MIB,
        after_trim as f64 / MIB,
    );
}

fn pass(store: &Store, name: &str, trim_every: Option<u64>) -> Result<u64, String> {
    let count = |it: &mut dyn Iterator<Item = nq_store::Result<()>>| {
        let mut n = 0u64;
        for entry in it {
            entry.map_err(|e| format!("{name}: {e}"))?;
            n += 1;
            if trim_every.is_some_and(|every| n.is_multiple_of(every)) {
                trim();
            }
        }
        Ok(n)
    };
    match name {
        "jobs" => count(&mut store.stored_jobs().map(|e| e.map(drop))),
        "records" => count(&mut store.job_records().map(|e| e.map(drop))),
        "duplicates" => count(&mut store.duplicates().map(|e| e.map(drop))),
        "every" => count(&mut store.scan_jobs(Scan::Every).map(|e| e.map(drop))),
        "done" => count(&mut store.scan_jobs(Scan::Done).map(|e| e.map(drop))),
        // A million small reads and nothing else: each pins sled's epoch,
        // so pages that sled replaced but has not freed yet (crossbeam-epoch
        // garbage) are freed meanwhile, while its cache and page table stay.
        "settle" => count(&mut (0..1_000_000).map(|_| store.manifest().map(drop))),
        other => Err(format!(
            "unknown pass {other:?}: expected jobs, records, duplicates, every, done \
             or settle"
        )),
    }
}

fn main() -> Result<(), String> {
    let args = Args::parse();
    if !args.no_tune {
        // As `nq_process::alloc::tune`: M_ARENA_MAX 2, M_MMAP_THRESHOLD 1 MiB.
        // SAFETY: `mallopt` only tunes the allocator.
        unsafe {
            mallopt(-8, 2);
            mallopt(-3, 1 << 20);
        }
    }
    if args.forget_summary {
        // Straight through sled: the store's API never unfinishes a run.
        let db = sled::Config::new()
            .path(&args.data)
            .open()
            .map_err(|e| format!("cannot open {}: {e}", args.data.display()))?;
        let meta = db.open_tree("meta").map_err(|e| e.to_string())?;
        let removed = meta.remove("summary").map_err(|e| e.to_string())?;
        db.flush().map_err(|e| e.to_string())?;
        std::fs::remove_file(args.data.join("report.json")).ok();
        println!(
            "{}: {}",
            args.data.display(),
            if removed.is_some() {
                "summary removed"
            } else {
                "held no summary"
            }
        );
        return Ok(());
    }
    let t = Instant::now();
    let options = StoreOptions {
        cache_capacity: args.cache_mib * 1024 * 1024,
        key: None,
    };
    let store = Store::open(&args.data, &options)
        .map_err(|e| format!("cannot open {}: {e}", args.data.display()))?;
    let r = read();
    trim();
    print(
        "open",
        0,
        t.elapsed().as_secs_f64(),
        r,
        status_field("VmRSS:"),
    );
    for name in &args.passes {
        let t = Instant::now();
        let n = pass(&store, name, args.trim_every)?;
        let r = read();
        trim();
        print(
            name,
            n,
            t.elapsed().as_secs_f64(),
            r,
            status_field("VmRSS:"),
        );
    }
    if args.exit_open {
        std::process::exit(0);
    }
    drop(store);
    let r = read();
    trim();
    print("closed", 0, 0.0, r, status_field("VmRSS:"));
    Ok(())
}
