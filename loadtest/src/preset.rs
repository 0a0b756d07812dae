//! The admission presets `tutor-load experiment` compares.

/// One admission setup the experiment compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Preset {
    /// The small clients alone (no other class), `policy = "lanes"`: the lowest small TTFT
    /// the engine gives this load; every other preset is read against it.
    Floor,
    /// `policy = "fifo"`.
    Fifo,
    /// `policy = "strict"`: the seed's caps.
    Strict,
    /// `policy = "lanes"`: work-conserving lanes.
    Lanes,
    /// `lanes` + `engine_priority` + the simulator's priority scheduling.
    LanesPriority,
    /// `lanes` with the autopilot on (`[autopilot] enabled = true`): the large lane's seats and
    /// the prefill budget paced to the lanes' TTFT objectives of the config file (its times,
    /// like every other, in simulated time: divided by the speed factor for the gateway).
    Autopilot,
    /// `lanes` through two gateway replicas sharing one quota in Redis (`quota.backend =
    /// "redis"`, a `redis-server` the run starts); the clients' requests alternate between
    /// them.
    LanesRedis,
}

impl Preset {
    /// Every preset, in run order.
    pub const ALL: [Preset; 7] = [
        Preset::Floor,
        Preset::Fifo,
        Preset::Strict,
        Preset::Lanes,
        Preset::LanesPriority,
        Preset::Autopilot,
        Preset::LanesRedis,
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
            Preset::LanesRedis => "lanes-redis",
        }
    }
}
