//! Deadlines: retransmissions, giving up, the end of time wait.

use super::Engine;
use crate::cep::ORPHAN;
use crate::event::Event;
use crate::msg::{RejReason, RejectedMsg};
use crate::types::{LapState, Nanos, Op, State};

impl Engine {
    /// Runs every deadline up to `now`: retransmits what is unanswered,
    /// gives up after the retries (REJ with reason Timeout for a
    /// connection, then an [`Event::Timeout`]), ends time waits.
    pub fn on_timer(&mut self, now: Nanos) {
        while let Some((&(at, idx), ())) = self.timers.first() {
            if at > now {
                break;
            }
            self.timers.pop_first();
            if let Some(c) = self.table.get_mut(idx) {
                c.deadline = 0;
            }
            self.expire(idx, now);
        }
    }

    fn expire(&mut self, idx: u32, now: Nanos) {
        let Some(c) = self.table.get_mut(idx) else {
            return;
        };
        let op = match (c.state, c.lap) {
            (State::Timewait, _) => return self.timewait_exit(idx),
            (State::ReqSent | State::MraReqRcvd, _) => Op::Connect,
            (State::RepSent | State::MraRepRcvd, _) => Op::Accept,
            (State::DreqSent, _) => Op::Disconnect,
            (State::SidrReqSent, _) => Op::Sidr,
            (State::Established, LapState::LapSent | LapState::MraLapRcvd) => Op::LoadAltPath,
            _ => return,
        };
        if c.retries > 0 {
            c.retries -= 1;
            let wait = Self::wait(c, c.resp_timeout);
            self.stats.retransmits += 1;
            self.resend(idx);
            self.arm(idx, now.saturating_add(wait));
            return;
        }
        self.stats.timeouts += 1;
        let guid = self.cfg.ca_guid.to_be_bytes();
        match op {
            Op::Connect => {
                self.send_rej(idx, RejectedMsg::Other, RejReason::TIMEOUT, &guid);
                self.reset_idle(idx);
            }
            Op::Accept => {
                self.send_rej(idx, RejectedMsg::Other, RejReason::TIMEOUT, &guid);
                self.enter_timewait(idx, now);
            }
            Op::Disconnect => self.enter_timewait(idx, now),
            Op::Sidr => self.reset_idle(idx),
            Op::LoadAltPath | Op::Listen => {
                if let Some(c) = self.table.get_mut(idx) {
                    c.end_lap();
                    c.sent = None;
                }
            }
        }
        self.push_event(idx, Event::Timeout { op });
    }

    fn timewait_exit(&mut self, idx: u32) {
        let Some(c) = self.table.get(idx) else {
            return;
        };
        if c.has(ORPHAN) {
            return self.release(idx);
        }
        self.reset_idle(idx);
        self.push_event(idx, Event::TimewaitExit);
    }
}
