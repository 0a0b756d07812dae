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
}

impl Preset {
    /// Every preset, in run order.
    pub const ALL: [Preset; 5] = [
        Preset::Floor,
        Preset::Fifo,
        Preset::Strict,
        Preset::Lanes,
        Preset::LanesPriority,
    ];

    /// The folder / summary key.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Floor => "floor",
            Preset::Fifo => "fifo",
            Preset::Strict => "strict",
            Preset::Lanes => "lanes",
            Preset::LanesPriority => "lanes-priority",
        }
    }
}
