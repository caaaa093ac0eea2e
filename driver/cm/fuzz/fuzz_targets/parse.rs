//! Arbitrary bytes as a CM MAD: parsing never panics, what parses
//! re-emits to bytes that parse to the same MAD, and an engine with a
//! listener takes the bytes (and its timers) without panicking.
//!
//! One engine serves every input, reset between them (`Engine::reset`,
//! tested to behave as a new one): building an engine per input cost most
//! of an execution. Seed corpus: `seeds/parse` (three valid MADs of each
//! message type, written by `driver/cm/tests/mad.rs`).
#![no_main]

use std::sync::Mutex;

use irpverbs_cm::{Config, Engine, MadAddr, msg};
use libfuzzer_sys::fuzz_target;

static ENGINE: Mutex<Option<Engine>> = Mutex::new(None);

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = msg::parse(data) {
        let again = msg::parse(&m.to_bytes()).expect("an emitted MAD parses");
        assert_eq!(again, m);
    }
    let mut slot = ENGINE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let e = slot.get_or_insert_with(|| Engine::new(Config::new(0x0002_C903_0000_0001)));
    e.reset();
    let l = e.create(0).expect("a CEP");
    let sid = data
        .get(32..40)
        .map_or(0, |b| u64::from_be_bytes(b.try_into().unwrap_or([0; 8])));
    e.listen(l, sid).expect("listen");
    let _ = e.receive(0, &MadAddr::default(), data);
    let _ = e.receive(1, &MadAddr::default(), data);
    e.on_timer(u64::MAX);
    while e.poll_transmit().is_some() {}
    while let Some((id, _)) = e.poll_ready() {
        while e.poll_event(id).is_some() {}
    }
});
