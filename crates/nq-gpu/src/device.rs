//! Every call into the CUDA driver and NVRTC, through cudarc, loaded at run
//! time.
//!
//! cudarc resolves each library on first use and PANICS when it is missing,
//! so every entry point here first asks [`libraries`] and returns an error
//! naming the missing library instead.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags, CUfunction_attribute};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, LaunchConfig,
    PinnedHostSlice, PushKernelArg,
};
use cudarc::nvrtc::{CompileOptions, Ptx};
use nq_core::board::Board;
use nq_core::search::{self, CountStats};
use nq_core::split::{SplitSpec, split};

use crate::pack::{Batch, SPILL_HEAD, STACK_DEPTH, TASK_WORDS, pack};
use crate::source::{EMBEDDED_PTX, KERNEL_SOURCE, embedded_is_current};
use crate::{BLOCK, Error, Result};

/// Which CUDA libraries this machine can load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Libraries {
    /// The driver, `libcuda.so.1`.
    pub driver: bool,
    /// The run-time compiler, `libnvrtc.so.12`.
    pub nvrtc: bool,
}

/// Tries to load each library (by cudarc's own list of names), without
/// resolving any symbol.
pub fn libraries() -> Libraries {
    // SAFETY: these only try `dlopen` on each candidate name and drop the
    // handle; loading a library runs its initialisers, which is what any
    // later use would do too.
    unsafe {
        Libraries {
            driver: cudarc::driver::sys::is_culib_present(),
            nvrtc: cudarc::nvrtc::sys::is_culib_present(),
        }
    }
}

/// A virtual GPU architecture NVRTC can target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Ampere A100 and later.
    Compute80,
    /// Ada (RTX 40xx).
    Compute89,
    /// Hopper (H100, H200).
    Compute90,
    /// Blackwell desktop (RTX 50xx).
    Compute120,
}

impl Arch {
    /// NVRTC's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Compute80 => "compute_80",
            Arch::Compute89 => "compute_89",
            Arch::Compute90 => "compute_90",
            Arch::Compute120 => "compute_120",
        }
    }

    /// Parses `compute_80`, `80`, `sm_90` and the like.
    pub fn parse(s: &str) -> Option<Arch> {
        let digits = s.trim_start_matches("compute_").trim_start_matches("sm_");
        match digits {
            "80" => Some(Arch::Compute80),
            "89" => Some(Arch::Compute89),
            "90" => Some(Arch::Compute90),
            "120" => Some(Arch::Compute120),
            _ => None,
        }
    }

    /// The newest of these that a device of compute capability
    /// `major.minor` runs (PTX is compiled forward by the driver, never back).
    fn for_device(major: i32, minor: i32) -> Arch {
        match major * 10 + minor {
            120.. => Arch::Compute120,
            90.. => Arch::Compute90,
            89 => Arch::Compute89,
            _ => Arch::Compute80,
        }
    }
}

/// Compiles the kernel for board size `n` and `arch` through NVRTC, with
/// `-DNQ_N=n` (the largest board it counts). The worker's own compile path; CI runs it for each target and
/// checks the result with `ptxas`.
///
/// # Errors
///
/// [`Error::NoNvrtc`] when `libnvrtc.so.12` cannot be loaded,
/// [`Error::Compile`] with NVRTC's log when it rejects the source.
pub fn compile_ptx(n: u8, arch: Arch) -> Result<String> {
    compile(n, arch, false)
}

/// [`compile_ptx`], or with `counters` the counters build of the kernel
/// (`-DNQ_COUNTERS`, see [`KernelCounters`]).
fn compile(n: u8, arch: Arch, counters: bool) -> Result<String> {
    if !libraries().nvrtc {
        return Err(Error::NoNvrtc);
    }
    let mut options = vec![format!("-DNQ_N={n}"), format!("-DNQ_BLOCK={BLOCK}")];
    if counters {
        options.push("-DNQ_COUNTERS".into());
    }
    let opts = CompileOptions {
        arch: Some(arch.name()),
        options,
        name: Some("count.cu".into()),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(KERNEL_SOURCE, opts)
        .map(|ptx| ptx.to_src())
        .map_err(|e| Error::Compile {
            arch: arch.name(),
            log: e.to_string(),
        })
}

/// The number of CUDA devices on this machine.
///
/// # Errors
///
/// [`Error::NoDriver`] without the driver library, [`Error::NoDevice`] when
/// the driver reports none (or cannot start).
pub fn device_count() -> Result<usize> {
    if !libraries().driver {
        return Err(Error::NoDriver);
    }
    match CudaContext::device_count() {
        Ok(c) if c > 0 => Ok(usize::try_from(c).unwrap_or(0)),
        Ok(_) => Err(Error::NoDevice {
            reason: "0 devices".into(),
        }),
        // cuInit fails with CUDA_ERROR_NO_DEVICE (or a driver/device
        // mismatch) on a machine with the library but no usable GPU.
        Err(e) => Err(Error::NoDevice {
            reason: e.to_string(),
        }),
    }
}

/// Launches a [`Gpu`] keeps in flight at most: one per stream, so that the
/// next launch's blocks take the SMs that the previous one's tail frees, and
/// the host packs the next batch while the GPU counts.
pub const SLOTS: usize = 2;

/// A stream and the pinned host buffers its launches copy their results
/// into (reused, grown as batches grow).
#[derive(Debug)]
struct Slot {
    stream: Arc<CudaStream>,
    counts: Option<PinnedHostSlice<u64>>,
    nodes: Option<PinnedHostSlice<u64>>,
    /// True from [`Gpu::submit`] to [`Gpu::finish`].
    busy: bool,
}

impl Slot {
    /// Grows the slot's pinned buffers for the results to hold `len`
    /// entries: pinned, so that their copies are asynchronous; grown to a
    /// power of two, so that they rarely are.
    fn ensure_pinned(&mut self, ctx: &Arc<CudaContext>, len: usize) -> Result<()> {
        for buf in [&mut self.counts, &mut self.nodes] {
            if buf.as_ref().is_none_or(|b| b.len() < len) {
                // SAFETY: the buffer is only read after the copy of the
                // kernel's results into it (finish reads `len` entries).
                let pinned = unsafe {
                    ctx.alloc_pinned_with_flags::<u64>(len.next_power_of_two(), 0)
                }
                .map_err(|source| Error::Driver {
                    call: "cuMemHostAlloc",
                    source,
                })?;
                *buf = Some(pinned);
            }
        }
        Ok(())
    }
}

/// The spill queue of a launch of `lanes` lanes on `s`: room for every
/// lane's whole stack, so that no reservation fails, and its head set.
fn spill_queue(s: &Arc<CudaStream>, lanes: u64) -> Result<CudaSlice<u32>> {
    let driver = |call| move |source| Error::Driver { call, source };
    let cap = u32::try_from(lanes * STACK_DEPTH as u64).expect("a grid's stacks fit");
    let mut head = vec![0u32; SPILL_HEAD];
    head[2] = cap;
    let mut spill = s
        .alloc_zeros::<u32>(SPILL_HEAD + cap as usize * TASK_WORDS)
        .map_err(driver("cuMemAlloc"))?;
    s.memcpy_htod(&head, &mut spill)
        .map_err(driver("cuMemcpyHtoDAsync"))?;
    Ok(spill)
}

/// A launch in flight, from [`Gpu::submit`]; hand it to [`Gpu::finish`].
#[derive(Debug)]
pub struct Launch {
    batch: Batch,
    slot: usize,
    tasks: u32,
    /// Device buffers the kernel reads and writes: kept until it is done.
    buffers: Option<(CudaSlice<u32>, CudaSlice<u32>, CudaSlice<u32>)>,
    results: Option<(CudaSlice<u64>, CudaSlice<u64>)>,
    /// The counters build's words, and the grid's lanes.
    counters: Option<(CudaSlice<u64>, u64)>,
    /// The spill queue (see `nq_spill` in the kernel).
    spill: Option<CudaSlice<u32>>,
    /// Recorded around the kernel on its stream, for its time.
    events: Option<(CudaEvent, CudaEvent)>,
    submitted: Instant,
}

/// What the counters build of the kernel measured in one launch (see
/// [`Gpu::with_counters`]): the figures Nsight Compute would give, for a GPU
/// machine without it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct KernelCounters {
    /// Laps (queens placed) summed over the lanes.
    pub laps: u64,
    /// Loop iterations summed over the lanes (a lap, plus the last one that
    /// found no task).
    pub lane_iterations: u64,
    /// Loop iterations summed over the warps: each warp's is its longest
    /// lane's, since a warp runs until its last lane leaves.
    pub warp_iterations: u64,
    /// Cycles from start to exit summed over the lanes, and the longest.
    pub lane_cycles: u64,
    /// The longest lane's cycles.
    pub max_lane_cycles: u64,
    /// Lanes of the grid.
    pub lanes: u64,
}

impl KernelCounters {
    /// Lanes active per warp iteration, of 32.
    pub fn lanes_active(&self) -> f64 {
        32.0 * self.laps as f64 / (32.0 * self.warp_iterations as f64).max(1.0)
    }

    /// Busy lane time over the launch's (lanes times the longest lane): the
    /// launch's tail efficiency.
    pub fn tail_efficiency(&self) -> f64 {
        self.lane_cycles as f64
            / (self.lanes as f64 * self.max_lane_cycles as f64).max(1.0)
    }

    /// Reads the counter words the kernel filled (`NQ_COUNTER_WARPS` = 4
    /// totals, then one word per warp).
    fn from_words(words: &[u64], lanes: u64) -> KernelCounters {
        KernelCounters {
            laps: words[0],
            lane_iterations: words[1],
            lane_cycles: words[2],
            max_lane_cycles: words[3],
            warp_iterations: words[COUNTER_WARPS..].iter().sum(),
            lanes,
        }
    }
}

/// `NQ_COUNTER_WARPS` in the kernel: the counter words before the per-warp
/// ones.
const COUNTER_WARPS: usize = 4;

/// Times of one launch, for the worker's log.
#[derive(Clone, Copy, Debug, Default)]
pub struct LaunchTimes {
    /// Tasks counted.
    pub tasks: u32,
    /// The kernel alone, by events on its stream.
    pub kernel_ms: f64,
    /// From [`Gpu::submit`] to the end of [`Gpu::finish`]: copies, kernel,
    /// and any wait behind the other stream's launch.
    pub wall_ms: f64,
    /// The counters build's figures ([`Gpu::with_counters`]).
    pub counters: Option<KernelCounters>,
    /// Tasks the launch gave back in its tail (the kernel's spill queue).
    pub spilled: usize,
    /// Follow-up launches of spilled tasks ([`Gpu::count_all`] only).
    pub follow_ups: usize,
}

/// A finished launch, from [`Gpu::finish`].
#[derive(Debug)]
pub struct Finished {
    /// The batch launched.
    pub batch: Batch,
    /// Its results per sub-problem, without what it spilled.
    pub stats: Vec<CountStats>,
    /// Its times.
    pub times: LaunchTimes,
    /// The tasks it gave back, [`TASK_WORDS`] words each: count them with a
    /// launch of [`Batch::follow_up`] and add its results to `stats`.
    pub spilled: Vec<u32>,
}

/// Adds `more` into `stats`, sub-problem by sub-problem.
///
/// # Errors
///
/// [`Error::Overflow`] if a sum would not fit, [`Error::ResultLength`] when
/// the two do not have one entry per sub-problem each.
pub fn add_stats(stats: &mut [CountStats], more: &[CountStats]) -> Result<()> {
    if stats.len() != more.len() {
        return Err(Error::ResultLength {
            got: more.len(),
            want: stats.len(),
        });
    }
    for (s, m) in stats.iter_mut().zip(more) {
        s.count = s.count.checked_add(m.count).ok_or(Error::Overflow)?;
        s.nodes = s.nodes.checked_add(m.nodes).ok_or(Error::Overflow)?;
    }
    Ok(())
}

/// One GPU, with the kernel loaded for each board size it has counted.
#[derive(Debug)]
pub struct Gpu {
    ctx: Arc<CudaContext>,
    slots: Vec<Slot>,
    /// The device's model name.
    name: String,
    /// What NVRTC targets for this device.
    arch: Arch,
    /// Streaming multiprocessors, for the grid size.
    sms: u32,
    /// True when NVRTC is present; otherwise the embedded PTX is used.
    nvrtc: bool,
    /// The kernel per board size, with its grid size.
    kernels: HashMap<u8, (CudaFunction, u32)>,
    /// True when the counters build runs ([`Gpu::with_counters`]).
    counters: bool,
}

impl Gpu {
    /// Opens device `index`.
    ///
    /// # Errors
    ///
    /// [`Error::NoDriver`], [`Error::NoDevice`] or [`Error::DeviceIndex`] on a
    /// machine without that GPU; [`Error::Driver`] when the driver fails.
    pub fn open(index: usize) -> Result<Gpu> {
        let libs = libraries();
        if !libs.driver {
            return Err(Error::NoDriver);
        }
        let count = match CudaContext::device_count() {
            Ok(c) => usize::try_from(c).unwrap_or(0),
            // cuInit fails with CUDA_ERROR_NO_DEVICE (or a driver/device
            // mismatch) on a machine with the library but no usable GPU.
            Err(e) => {
                return Err(Error::NoDevice {
                    reason: e.to_string(),
                });
            }
        };
        if count == 0 {
            return Err(Error::NoDevice {
                reason: "0 devices".into(),
            });
        }
        if index >= count {
            return Err(Error::DeviceIndex { index, count });
        }
        let driver = |call| move |source| Error::Driver { call, source };
        let ctx = CudaContext::new(index).map_err(driver("cuDevicePrimaryCtxRetain"))?;
        let name = ctx.name().map_err(driver("cuDeviceGetName"))?;
        let attr = |a| ctx.attribute(a).map_err(driver("cuDeviceGetAttribute"));
        let major =
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor =
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let sms = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let slots = (0..SLOTS)
            .map(|_| {
                Ok(Slot {
                    stream: ctx.new_stream().map_err(driver("cuStreamCreate"))?,
                    counts: None,
                    nodes: None,
                    busy: false,
                })
            })
            .collect::<Result<Vec<Slot>>>()?;
        Ok(Gpu {
            ctx,
            slots,
            name,
            arch: Arch::for_device(major, minor),
            sms: u32::try_from(sms).unwrap_or(1).max(1),
            nvrtc: libs.nvrtc,
            kernels: HashMap::new(),
            counters: false,
        })
    }

    /// Runs the counters build of the kernel from now on (compiled through
    /// NVRTC with `-DNQ_COUNTERS`): each launch's [`LaunchTimes::counters`]
    /// then holds lanes active per iteration and the tail, at some cost in
    /// speed. For the device benchmark on a machine without Nsight Compute.
    ///
    /// # Errors
    ///
    /// [`Error::NoNvrtc`] without NVRTC: the embedded PTX is the plain build.
    pub fn with_counters(mut self) -> Result<Gpu> {
        if !self.nvrtc {
            return Err(Error::NoNvrtc);
        }
        self.counters = true;
        self.kernels.clear();
        Ok(self)
    }

    /// The device's model name, as the driver gives it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How the kernel is compiled here: `"nvrtc"` or `"embedded ptx"`.
    pub fn compiler(&self) -> &'static str {
        if self.nvrtc { "nvrtc" } else { "embedded ptx" }
    }

    /// The kernel for board size `n`, compiled on first use, and its grid.
    fn kernel(&mut self, n: u8) -> Result<(CudaFunction, u32)> {
        if let Some(k) = self.kernels.get(&n) {
            return Ok(k.clone());
        }
        let ptx = if self.nvrtc {
            Ptx::from_src(compile(n, self.arch, self.counters)?)
        } else {
            // Valid for every board (built for N = 32); a test keeps it in
            // step with the source.
            debug_assert!(embedded_is_current());
            Ptx::from_src(EMBEDDED_PTX)
        };
        let module = match self.ctx.load_module(ptx) {
            Ok(m) => m,
            Err(e) if !self.nvrtc => {
                return Err(Error::NoCompiler {
                    reason: e.to_string(),
                });
            }
            Err(source) => {
                return Err(Error::Driver {
                    call: "cuModuleLoadData",
                    source,
                });
            }
        };
        let driver = |call| move |source| Error::Driver { call, source };
        let func = module
            .load_function("nq_count")
            .map_err(driver("cuModuleGetFunction"))?;
        // The kernel uses shared memory and no L1-heavy loads: ask for the
        // largest shared-memory carve-out, so that the most blocks fit (the
        // default lets the driver pick, and the occupancy below follows it).
        func.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
            100,
        )
        .map_err(driver("cuFuncSetAttribute"))?;
        // Persistent threads: exactly as many blocks as stay resident.
        let per_sm = func
            .occupancy_max_active_blocks_per_multiprocessor(BLOCK, 0, None)
            .map_err(driver("cuOccupancyMaxActiveBlocksPerMultiprocessor"))?;
        let grid = self.sms * per_sm.max(1);
        tracing::info!(
            gpu = %self.name,
            n,
            compiler = self.compiler(),
            arch = self.arch.name(),
            grid,
            block = BLOCK,
            "GPU kernel loaded"
        );
        self.kernels.insert(n, (func.clone(), grid));
        Ok((func, grid))
    }

    /// Counts every task of `batch` and folds the results per sub-problem:
    /// [`Gpu::count_all`] on a copy.
    ///
    /// # Errors
    ///
    /// As [`Gpu::count_all`].
    pub fn count(&mut self, batch: &Batch) -> Result<Vec<CountStats>> {
        Ok(self.count_all(batch.clone())?.0)
    }

    /// True when a stream is free for [`Gpu::submit`].
    pub fn can_submit(&self) -> bool {
        self.slots.iter().any(|s| !s.busy)
    }

    /// Starts counting `batch` on a free stream and returns at once: the
    /// copies in, the kernel and the copies of its results into pinned host
    /// memory are queued on that stream. At most [`SLOTS`] launches are in
    /// flight; the host can pack the next batch meanwhile.
    ///
    /// # Errors
    ///
    /// [`Error::SlotsBusy`] when [`SLOTS`] launches are in flight,
    /// [`Error::Driver`] when a copy or the launch fails, and the compile
    /// errors of [`compile_ptx`].
    pub fn submit(&mut self, batch: Batch) -> Result<Launch> {
        let submitted = Instant::now();
        let slot = self
            .slots
            .iter()
            .position(|s| !s.busy)
            .ok_or(Error::SlotsBusy { slots: SLOTS })?;
        let tasks = batch.task_count();
        let mut launch = Launch {
            batch,
            slot,
            tasks,
            buffers: None,
            results: None,
            counters: None,
            spill: None,
            events: None,
            submitted,
        };
        if tasks == 0 {
            return Ok(launch);
        }
        let (func, grid) = self.kernel(launch.batch.board().n())?;
        let driver = |call| move |source| Error::Driver { call, source };
        let ctx = &self.ctx;
        let slot = &mut self.slots[slot];
        let len = tasks as usize;
        slot.ensure_pinned(ctx, len)?;
        let s = &slot.stream;
        let tables = s
            .clone_htod(launch.batch.tables())
            .map_err(driver("cuMemcpyHtoDAsync"))?;
        let task_buf = s
            .clone_htod(launch.batch.tasks())
            .map_err(driver("cuMemcpyHtoDAsync"))?;
        let n = u32::from(launch.batch.board().n());
        let mut next = s.alloc_zeros::<u32>(1).map_err(driver("cuMemAlloc"))?;
        let mut counts = s.alloc_zeros::<u64>(len).map_err(driver("cuMemAlloc"))?;
        let mut nodes = s.alloc_zeros::<u64>(len).map_err(driver("cuMemAlloc"))?;
        // The kernel's last argument: the counters build's words, or a null
        // pointer (passed as a 64-bit 0) that the plain build never reads.
        let lanes = u64::from(grid) * u64::from(BLOCK);
        let mut counter_words = if self.counters {
            let warps = usize::try_from(lanes / 32).expect("a grid fits memory");
            Some(
                s.alloc_zeros::<u64>(COUNTER_WARPS + warps)
                    .map_err(driver("cuMemAlloc"))?,
            )
        } else {
            None
        };
        let mut spill = spill_queue(s, lanes)?;
        let null = 0u64;
        let cfg = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let timing = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let start = s.record_event(timing).map_err(driver("cuEventRecord"))?;
        let mut args = s.launch_builder(&func);
        args.arg(&tables)
            .arg(&task_buf)
            .arg(&tasks)
            .arg(&mut next)
            .arg(&n)
            .arg(&mut counts)
            .arg(&mut nodes)
            .arg(&mut spill);
        match &mut counter_words {
            Some(words) => args.arg(words),
            None => args.arg(&null),
        };
        // SAFETY: the arguments match the kernel's signature in count.cu
        // (two u32 buffers, a u32, a u32 counter set to 0, the board size
        // (at most the NQ_N it was compiled for), two u64 buffers of one
        // entry per task, the spill queue (its head set above, room for its
        // capacity), and the counters build's u64 words (one per warp after
        // the totals) or a null pointer), and the block size is the
        // NQ_BLOCK it was compiled for. The buffers live in `launch` until
        // finish has synchronised the stream.
        unsafe { args.launch(cfg) }.map_err(driver("cuLaunchKernel"))?;
        let end = s.record_event(timing).map_err(driver("cuEventRecord"))?;
        let (pc, pn) = (
            slot.counts.as_mut().expect("allocated above"),
            slot.nodes.as_mut().expect("allocated above"),
        );
        s.memcpy_dtoh(&counts, pc)
            .map_err(driver("cuMemcpyDtoHAsync"))?;
        s.memcpy_dtoh(&nodes, pn)
            .map_err(driver("cuMemcpyDtoHAsync"))?;
        slot.busy = true;
        launch.buffers = Some((tables, task_buf, next));
        launch.results = Some((counts, nodes));
        launch.counters = counter_words.map(|w| (w, lanes));
        launch.spill = Some(spill);
        launch.events = Some((start, end));
        Ok(launch)
    }

    /// Waits for `launch` and folds its results per sub-problem.
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] when the stream reports a failure, and those of
    /// [`Batch::fold`].
    pub fn finish(&mut self, launch: Launch) -> Result<Finished> {
        let driver = |call| move |source| Error::Driver { call, source };
        let slot = &mut self.slots[launch.slot];
        let mut times = LaunchTimes {
            tasks: launch.tasks,
            ..LaunchTimes::default()
        };
        if launch.tasks == 0 {
            let stats = launch.batch.fold(&[], &[])?;
            return Ok(Finished {
                batch: launch.batch,
                stats,
                times,
                spilled: vec![],
            });
        }
        // Whatever happens next, the slot's stream is done with this launch
        // once it is synchronised (or has failed).
        slot.busy = false;
        slot.stream
            .synchronize()
            .map_err(driver("cuStreamSynchronize"))?;
        if let Some((start, end)) = &launch.events {
            times.kernel_ms = f64::from(
                start
                    .elapsed_ms(end)
                    .map_err(driver("cuEventElapsedTime"))?,
            );
        }
        let len = launch.tasks as usize;
        let counts = slot.counts.as_ref().expect("allocated by submit");
        let nodes = slot.nodes.as_ref().expect("allocated by submit");
        let counts = &counts.as_slice().map_err(driver("cuEventSynchronize"))?[..len];
        let nodes = &nodes.as_slice().map_err(driver("cuEventSynchronize"))?[..len];
        let stats = launch.batch.fold(counts, nodes)?;
        if let Some((words, lanes)) = &launch.counters {
            let words = slot
                .stream
                .clone_dtoh(words)
                .map_err(driver("cuMemcpyDtoH"))?;
            times.counters = Some(KernelCounters::from_words(&words, *lanes));
        }
        let mut spilled = vec![];
        if let Some(spill) = &launch.spill {
            let head = slot
                .stream
                .clone_dtoh(&spill.slice(..SPILL_HEAD))
                .map_err(driver("cuMemcpyDtoH"))?;
            let written = head[1] as usize * TASK_WORDS;
            if written > 0 {
                spilled = slot
                    .stream
                    .clone_dtoh(&spill.slice(SPILL_HEAD..SPILL_HEAD + written))
                    .map_err(driver("cuMemcpyDtoH"))?;
            }
        }
        times.spilled = spilled.len() / TASK_WORDS;
        times.wall_ms = launch.submitted.elapsed().as_secs_f64() * 1e3;
        Ok(Finished {
            batch: launch.batch,
            stats,
            times,
            spilled,
        })
    }

    /// Counts `batch` to the end: launches it, then a follow-up launch of
    /// what each launch spilled ([`Batch::follow_up`]) until none spills,
    /// and adds the results up. Returns them with the times of the first
    /// launch, the follow-ups' kernel time and spills added in.
    ///
    /// # Errors
    ///
    /// As [`Gpu::submit`] and [`Gpu::finish`], and [`Error::Overflow`] if a
    /// sum would not fit (no correct result does).
    pub fn count_all(&mut self, batch: Batch) -> Result<(Vec<CountStats>, LaunchTimes)> {
        let first = self.finish_submit(batch)?;
        let mut stats = first.stats;
        let mut times = first.times;
        let mut spilled = first.spilled;
        let mut batch = first.batch;
        while !spilled.is_empty() {
            batch = batch.follow_up(&spilled)?;
            let more = self.finish_submit(batch)?;
            add_stats(&mut stats, &more.stats)?;
            times.kernel_ms += more.times.kernel_ms;
            times.spilled += more.times.spilled;
            times.follow_ups += 1;
            spilled = more.spilled;
            batch = more.batch;
        }
        Ok((stats, times))
    }

    fn finish_submit(&mut self, batch: Batch) -> Result<Finished> {
        let launch = self.submit(batch)?;
        self.finish(launch)
    }

    /// The startup self-test: counts every sub-problem of N = 12 (border
    /// split, one extra column) on this GPU and on nq-core's depth-first
    /// reference, completions and nodes, and fails on the first difference.
    /// Run it before any work: a faulty GPU, driver or compile shows here in
    /// milliseconds instead of as a wrong total.
    ///
    /// # Errors
    ///
    /// [`Error::SelfTest`] naming the first sub-problem that differs, or the
    /// errors of [`Gpu::count`].
    pub fn self_test(&mut self) -> Result<()> {
        let board = Board::new(12).expect("a valid board size");
        let subs = split(board, SplitSpec::border(1).expect("a valid spec"));
        // Expanded as a real launch would be, so the kernel sees many tasks
        // per sub-problem and deep stacks alike.
        let batch = pack(&subs, 1 << 14)?;
        let got = self.count(&batch)?;
        compare_with_reference(&subs, &got)
    }
}

/// Compares per-sub-problem results with nq-core's depth-first reference.
pub(crate) fn compare_with_reference(
    subs: &[nq_core::split::SubProblem],
    got: &[CountStats],
) -> Result<()> {
    let never = AtomicBool::new(false);
    for (sub, got) in subs.iter().zip(got) {
        let want = search::count_masked_reference(sub.prefix(), &sub.forbidden(), &never)
            .expect("never stopped");
        if *got != want {
            return Err(Error::SelfTest {
                subproblem: format!("{:?}", sub.prefix()),
                got: got.count,
                got_nodes: got.nodes,
                want: want.count,
                want_nodes: want.nodes,
            });
        }
    }
    if got.len() != subs.len() {
        return Err(Error::ResultLength {
            got: got.len(),
            want: subs.len(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_names_parse_and_devices_map_forward_only() {
        for a in [
            Arch::Compute80,
            Arch::Compute89,
            Arch::Compute90,
            Arch::Compute120,
        ] {
            assert_eq!(Arch::parse(a.name()), Some(a));
        }
        assert_eq!(Arch::parse("sm_90"), Some(Arch::Compute90));
        assert_eq!(Arch::parse("75"), None);
        assert_eq!(Arch::for_device(9, 0), Arch::Compute90);
        assert_eq!(Arch::for_device(10, 0), Arch::Compute90);
        assert_eq!(Arch::for_device(8, 6), Arch::Compute80);
        assert_eq!(Arch::for_device(12, 0), Arch::Compute120);
    }

    /// On a machine without a driver (CI, this project's build machines)
    /// opening a GPU is an error naming the driver, never a panic.
    #[test]
    fn no_driver_is_an_error_not_a_panic() {
        if libraries().driver {
            return; // a GPU host: covered by the self-test instead
        }
        let e = Gpu::open(0).unwrap_err();
        assert!(matches!(e, Error::NoDriver), "{e}");
        assert!(e.to_string().contains("libcuda.so.1"), "{e}");
    }

    #[test]
    fn the_reference_comparison_names_the_first_difference() {
        let subs = split(Board::new(8).unwrap(), SplitSpec::BORDER);
        let never = AtomicBool::new(false);
        let mut got: Vec<CountStats> = subs
            .iter()
            .map(|s| {
                search::count_masked_reference(s.prefix(), &s.forbidden(), &never)
                    .unwrap()
            })
            .collect();
        compare_with_reference(&subs, &got).unwrap();
        got[1].count += 1;
        let e = compare_with_reference(&subs, &got).unwrap_err().to_string();
        assert!(e.contains(&format!("{:?}", subs[1].prefix())), "{e}");
    }
}
