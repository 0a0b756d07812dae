#![no_main]
// The checks live in the gateway (`tutor_gateway::fuzz`), so the corpus replays on stable.
libfuzzer_sys::fuzz_target!(|data: &[u8]| tutor_gateway::fuzz::request_fields(data));
