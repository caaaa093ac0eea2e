//! Deadlines: retransmissions, giving up, the end of time wait.

use super::Engine;
use crate::cep::ORPHAN;
use crate::event::Event;
use crate::msg::{self, CmMsg, Info, Rej, RejReason, RejectedMsg};
use crate::types::{LapState, Nanos, Op, State};

impl Engine {
    /// Runs every deadline up to `now`: retransmits what is unanswered,
    /// gives up after the retries (REJ with reason Timeout for a
    /// connection, then an [`Event::Timeout`]), ends time waits.
    pub fn on_timer(&mut self, now: Nanos) {
        while let Some(&(at, idx)) = self.timers.first() {
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
            let wait = if op == Op::Sidr {
                crate::types::cm_time(c.resp_timeout)
            } else {
                Self::wait(c, c.resp_timeout)
            };
            self.stats.retransmits += 1;
            self.resend(idx);
            self.arm(idx, now.saturating_add(wait));
            return;
        }
        self.stats.timeouts += 1;
        let timeout_rej = Rej {
            local_comm_id: c.id.0,
            remote_comm_id: c.remote_id,
            msg_rejected: RejectedMsg::Other,
            reason: RejReason::TIMEOUT,
            ari: Info::new(&self.cfg.ca_guid.to_be_bytes()).unwrap_or_default(),
            private_data: [0; msg::REJ_PDATA],
        };
        let (dest, tid) = (c.addr, c.tid);
        match op {
            Op::Connect => {
                self.send(dest, tid, CmMsg::Rej(timeout_rej));
                self.reset_idle(idx);
            }
            Op::Accept => {
                self.send(dest, tid, CmMsg::Rej(timeout_rej));
                self.enter_timewait(idx, now);
            }
            Op::Disconnect => self.enter_timewait(idx, now),
            Op::Sidr => self.reset_idle(idx),
            Op::LoadAltPath | Op::Listen => {
                c.lap = LapState::Idle;
                c.sent = None;
                c.alt_pending = None;
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
