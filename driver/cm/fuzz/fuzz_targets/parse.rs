//! Arbitrary bytes as a CM MAD: parsing never panics, what parses
//! re-emits to bytes that parse to the same MAD, and an engine with a
//! listener takes the bytes (and its timers) without panicking.
#![no_main]

use irpverbs_cm::{Config, Engine, MadAddr, msg};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = msg::parse(data) {
        let again = msg::parse(&m.to_bytes()).expect("an emitted MAD parses");
        assert_eq!(again, m);
    }
    let mut e = Engine::new(Config::new(0x0002_C903_0000_0001));
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
