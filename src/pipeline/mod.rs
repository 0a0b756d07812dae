//! One request's journey, in order. Its route handler in [`crate::api`] takes one snapshot of
//! the configuration in force and what is built from it ([`RequestCtx::snapshot`]) and calls
//! [`answer`] or [`openai`] ([`entry`]), which pass it down every step; each step consumes the
//! value the one before made:
//!
//! 1. **parse** ([`parse`]): body or query checked, each problem named by its field
//!    (`AnswerRequest`, `OpenAiRequest`);
//! 2. **prepare** ([`prompt`]): the messages vLLM will see, course prefix first, code focused,
//!    tools canonical ([`Prepared`]);
//! 3. **classify** ([`classify()`]): estimated work -> first lane, then the continuation choice
//!    for a session ([`crate::classify::LaneRules`]); the body shaped for the engine ([`Ready`]);
//! 4. **admit** ([`admit()`], [`crate::admission`]): a seat and a token reservation, held by a
//!    [`crate::admission::LaneGuard`] ([`Admitted`]);
//! 5. **send** ([`send()`], [`crate::upstream`]): the streaming request to vLLM, a long prompt
//!    first prefilled in pieces through vLLM's prefix cache when configured ([`pieces`]);
//! 6. **relay** ([`crate::relay`]): the stream back to the client, counted and bounded, which
//!    owns the guard until the end.
//!
//! A failure before the stream begins becomes its HTTP status ([`respond::rejected`]); after
//! that the relay renders it in the stream. A reload ([`reload`]) never changes what a running
//! request sees ([`ctx`]).

pub mod admit;
pub mod classify;
pub mod ctx;
pub mod entry;
pub mod parse;
pub mod pieces;
pub mod prompt;
pub mod reload;
pub mod respond;
mod resume;
pub mod send;
mod state;
pub mod tenant;
pub mod tokenize;

pub use admit::{admit, Admit, Admitted, Divert, NotTaken};
pub use classify::{classify, Ready};
pub use ctx::RequestCtx;
pub use ctx::PARSE_INLINE_BYTES;
pub use entry::{answer, openai, AnswerInput};
pub use prompt::Prepared;
pub use respond::refused;
pub use send::send;
pub use state::{issuing_request_ids, new_request_id, AppState, Overrides};
pub use tenant::Tenant;
