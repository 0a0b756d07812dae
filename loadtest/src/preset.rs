//! The admission presets `tutor-load experiment` compares.

/// One admission setup the experiment compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Preset {
    /// The small clients alone (no other class), `policy = "lanes"`: the lowest small TTFT
    /// the engine gives this load; every other preset is read against it.
    Floor,
    /// `policy = "fifo"`.
    Fifo,
    /// `policy = "strict"` with the seed's caps: 32/20/4 seats (M16), whatever the config
    /// file's lanes say.
    Strict,
    /// `policy = "lanes"`: work-conserving lanes.
    Lanes,
    /// `lanes` + `engine_priority` + the simulator's priority scheduling.
    LanesPriority,
    /// `lanes` with the autopilot on (`[autopilot] enabled = true`): the large lane's seats and
    /// the prefill budget paced to the lanes' TTFT objectives of the config file (its times,
    /// like every other, in simulated time: divided by the speed factor for the gateway).
    Autopilot,
    /// `lanes` with long prompts prefilled in pieces (`admission.prefill_piece_tokens`: the
    /// config file's, or 1024 when it has none).
    LanesPieces,
    /// `autopilot` with long prompts prefilled in pieces, as `lanes-pieces`.
    AutopilotPieces,
    /// `lanes` through two gateway replicas sharing one quota in Redis (`quota.backend =
    /// "redis"`, a `redis-server` the run starts); the clients' requests alternate between
    /// them.
    LanesRedis,
    /// `lanes` with pre-emptible background jobs (`jobs.preempt = true`, issue 35): jobs borrow
    /// any lane's idle seats and give them back when an interactive request needs one. Every
    /// other preset runs with `jobs.preempt = false` (jobs only on idle large-lane seats).
    LanesPreempt,
    /// `lanes-preempt` with the quota in Redis (`quota.backend = "redis"`, a `redis-server` the
    /// run starts), one gateway: the pre-emption rules as the quota's Lua scripts run them for
    /// a fleet (borrowed leases, the leave channel, the fleet-wide cool-down).
    LanesPreemptRedis,
    /// `lanes-preempt` with the autopilot on (as `autopilot`): the small lane's reservation
    /// paced to its objective decides how many questions may ask a job for its seat.
    AutopilotPreempt,
    /// `lanes-preempt` with long prompts prefilled in pieces, as `lanes-pieces`: a job's prompt
    /// reaches the engine one piece a request, so an engine step carries at most one piece of
    /// it beside the questions' prompts.
    LanesPreemptPieces,
}

impl Preset {
    /// Every preset, in run order.
    pub const ALL: [Preset; 13] = [
        Preset::Floor,
        Preset::Fifo,
        Preset::Strict,
        Preset::Lanes,
        Preset::LanesPriority,
        Preset::Autopilot,
        Preset::LanesPieces,
        Preset::AutopilotPieces,
        Preset::LanesRedis,
        Preset::LanesPreempt,
        Preset::LanesPreemptRedis,
        Preset::AutopilotPreempt,
        Preset::LanesPreemptPieces,
    ];

    /// The folder / summary key.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Floor => "floor",
            Preset::Fifo => "fifo",
            Preset::Strict => "strict",
            Preset::Lanes => "lanes",
            Preset::LanesPriority => "lanes-priority",
            Preset::Autopilot => "autopilot",
            Preset::LanesPieces => "lanes-pieces",
            Preset::AutopilotPieces => "autopilot-pieces",
            Preset::LanesRedis => "lanes-redis",
            Preset::LanesPreempt => "lanes-preempt",
            Preset::LanesPreemptRedis => "lanes-preempt-redis",
            Preset::AutopilotPreempt => "autopilot-preempt",
            Preset::LanesPreemptPieces => "lanes-preempt-pieces",
        }
    }
}

impl Preset {
    /// Whether the autopilot is on.
    pub fn piloted(self) -> bool {
        matches!(
            self,
            Preset::Autopilot | Preset::AutopilotPieces | Preset::AutopilotPreempt
        )
    }

    /// Whether background jobs are pre-emptible (`jobs.preempt`).
    pub fn preempts(self) -> bool {
        matches!(
            self,
            Preset::LanesPreempt
                | Preset::LanesPreemptRedis
                | Preset::AutopilotPreempt
                | Preset::LanesPreemptPieces
        )
    }

    /// Whether the quota is in a `redis-server` the run starts.
    pub fn on_redis(self) -> bool {
        matches!(self, Preset::LanesRedis | Preset::LanesPreemptRedis)
    }

    /// Whether long prompts are prefilled in pieces.
    pub fn pieced(self) -> bool {
        matches!(
            self,
            Preset::LanesPieces | Preset::AutopilotPieces | Preset::LanesPreemptPieces
        )
    }
}
