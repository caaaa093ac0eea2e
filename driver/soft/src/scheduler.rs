//! The scheduler: how the soft HCA's work runs, whatever started it.
//!
//! Work comes in through three doors, and the command queue:
//!
//! - **a doorbell**: a send, receive or SRQ doorbell, a CQ armed, a
//!   doorbell page rung ([`SoftHca::poll_doorbells`]); the `Hca` methods
//!   mark the queue's work ([`SoftHca::doorbell`]; a send doorbell first
//!   tries the fast path in the same hold);
//! - **a received datagram**: [`SoftHca::receive`], or
//!   [`SoftHca::receive_queued`] for a batch and [`SoftHca::run_deferred`]
//!   after it;
//! - **the clock**: [`SoftHca::advance_clock`] (a link's timer thread, or
//!   the platform's timer DPC through an attached [`crate::Clock`]);
//! - **commands**: `Hca::post_command`, executed by
//!   [`SoftHca::run_firmware`].
//!
//! Each ends in one run ([`SoftHca::run`]): under one hold of `HCA_LOCK`,
//! what the door brings (the doorbell's marking, the timers, the
//! commands), then a data-path step ([`SoftHca::step_locked`]); with no
//! lock held, the datagrams to the link ([`SoftHca::flush_tx`]) and the
//! interrupt; then more steps, this HCA's and those of the inline HCAs it
//! sent frames to (a work list, never recursion), until the work is done
//! or the budget ([`crate::SoftConfig::dpc_budget`]) is spent; what is
//! left is requeued ([`SoftHca::requeue`]): another DPC inline, the
//! hardware thread deferred.
//!
//! [`crate::Execution::Deferred`]: every door only wakes the hardware
//! thread ([`crate::SoftBus::doorbell`]), which calls [`SoftHca::run_firmware`].
//!
//! IRQL: every door is callable at <= DISPATCH_LEVEL; a run holds
//! `HCA_LOCK` (DISPATCH_LEVEL) for one step at a time.

use alloc::sync::Weak;
use core::sync::atomic::Ordering;

use irpverbs_core::{Platform, SpinLock};

use crate::fabric::Todo;
use crate::firmware::Firmware;
use crate::net::link;
use crate::transport::engine::REQUESTER_BUDGET;
use crate::wire::packet::Frame;
use crate::{Datagram, Execution, HcaState, Peer, SoftHca, SoftStats, TxQueue, wire};

impl<P: Platform> SoftHca<P> {
    /// A datagram from the wire: checks it (every header and the ICRC),
    /// copies its payload into a receive buffer and delivers it to the
    /// transport. Inline, the data path runs now, on this thread; deferred,
    /// the hardware thread is woken.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// Why the datagram was dropped (also counted in [`Self::link_stats`]);
    /// [`wire::WireError::Truncated`] too when no receive buffer was free.
    pub fn receive(&self, d: &Datagram<'_>) -> Result<(), wire::WireError> {
        self.receive_queued(d)?;
        self.run_deferred(true);
        Ok(())
    }

    /// Runs the data path on what [`Self::receive_queued`] queued (inline;
    /// deferred, wakes the hardware thread). With `flush` false the
    /// datagrams this produces for the link (ACKs, mostly) stay queued
    /// until [`Self::flush_transmit`] or the next run that flushes: a
    /// thread that busy-polls the wire and answers what it got sends the
    /// ACK and its answer in one system call.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn run_deferred(&self, flush: bool) {
        match self.execution {
            Execution::Inline => self.run(0, flush, |_| ((), false)),
            Execution::Deferred => self.bus.doorbell(),
        }
    }

    /// Fires the timers due at `now_ns` (on the link's clock; with a
    /// [`crate::Clock`] attached, at its time instead), runs the data
    /// path, and returns the next deadline (`None`: no timer armed). The
    /// host calls it at the deadline it returned (or sooner); with a
    /// [`crate::Clock`], the transport also arms the platform's timer for
    /// that deadline itself.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn advance_clock(&self, now_ns: u64) -> Option<u64> {
        self.run(0, true, |st| {
            st.firmware.fire_timers(now_ns);
            ((), false)
        });
        self.next_deadline()
    }

    /// Runs the data path for one more budget of work, requeueing what is
    /// still left: what the host's DPC calls after [`crate::SoftBus::resume`].
    ///
    /// IRQL: <= DISPATCH_LEVEL (the host: DISPATCH_LEVEL, in its DPC).
    pub fn resume(&self) {
        self.run(0, true, |_| ((), false));
    }

    /// Executes queued commands, in order, until the queue is empty or the
    /// event queue has no room, then runs the data path (send queues,
    /// inbound packets) for a budget; returns how many commands ran. In
    /// [`Execution::Deferred`] mode the host calls this from its "hardware"
    /// thread after [`crate::SoftBus::doorbell`]; in [`Execution::Inline`] mode the
    /// device calls it itself (calling it too is harmless).
    ///
    /// Raises the interrupt when an armed event queue gets an entry.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub fn run_firmware(&self) -> usize {
        self.run(0, true, |st| self.execute_queued(st))
    }

    /// Executes the queued commands under `HCA_LOCK`, until the queue is
    /// empty or the event queue is full: (commands run, raise the
    /// interrupt).
    pub(crate) fn execute_queued(&self, st: &mut HcaState) -> (usize, bool) {
        let mut ran = 0;
        let mut raise = false;
        while let Some(r) = self.execute_one(st) {
            ran += 1;
            raise |= r;
        }
        (ran, raise)
    }

    /// The rest of a run whose first part (`used` packets of work) ran
    /// outside it, on this thread: requeued when that spent the budget.
    pub(crate) fn run_after(&self, used: u64) {
        if used >= self.budget {
            self.requeue();
        } else {
            self.run(used, true, |_| ((), false));
        }
    }

    /// Gets queued commands executed: runs the firmware ([`Execution::Inline`])
    /// or rings the doorbell ([`Execution::Deferred`]). No lock held.
    pub(crate) fn kick(&self) {
        match self.execution {
            Execution::Inline => {
                self.run_firmware();
            }
            Execution::Deferred => self.bus.doorbell(),
        }
    }

    /// Rings a data-path doorbell: `mark` records the work and says whether
    /// there is any; inline, the work runs now; deferred, the hardware
    /// thread is woken.
    pub(crate) fn doorbell(&self, mark: impl FnOnce(&mut Firmware) -> bool) {
        if self.state.lock(|st| mark(&mut st.firmware)) {
            self.run_deferred(true);
        }
    }

    /// A receive doorbell has nothing to do: no QP is in ERR and no
    /// responder waits for a receive. The fence pairs with
    /// [`crate::firmware::datapath::DataPath::attend`]: the ULP published its WQE before, so
    /// either this sees the attention, or the HCA sees the WQE.
    pub(crate) fn quiet(&self) -> bool {
        core::sync::atomic::fence(Ordering::SeqCst);
        self.attention.load(Ordering::SeqCst) == 0
    }

    /// The run every door ends in, on this thread: `first` under
    /// `HCA_LOCK` (what the door brings; it returns its result and whether
    /// to raise the interrupt), a data-path step in the same hold, then
    /// steps until the work is done or the budget is spent (`used`
    /// packets of it spent already). With `flush` false this HCA's
    /// datagrams for its link stay queued.
    pub(crate) fn run<R>(
        &self,
        used: u64,
        flush: bool,
        first: impl FnOnce(&mut HcaState) -> (R, bool),
    ) -> R {
        let mut todo = Todo::new();
        let (out, again, work) = self.step(&mut todo, flush, first);
        self.run_rest(todo, again, flush, used + work);
        out
    }

    /// One step: `first` and the data path's step under one hold of
    /// `HCA_LOCK`; after releasing it, the work counted, the datagrams to
    /// the link (with `flush`), the interrupt. Returns (`first`'s result,
    /// work is left, packets of work done). Inlined into its callers: one
    /// frame fewer on the deepest chains (docs/stack-budget.md).
    #[inline(always)]
    pub(crate) fn step<R>(
        &self,
        todo: &mut Todo,
        flush: bool,
        first: impl FnOnce(&mut HcaState) -> (R, bool),
    ) -> (R, bool, u64) {
        let (out, raise, more, work) = self.state.lock(|st| {
            let before = st.firmware.dp.work_done();
            let (out, r) = first(st);
            let (raise, more) = self.step_locked(st, todo);
            (out, r | raise, more, st.firmware.dp.work_done() - before)
        });
        self.bus.work(work);
        if flush {
            self.flush_tx();
        }
        self.raise(raise);
        (out, more, work)
    }

    /// The rest of a run, after a first step: the HCAs on the work list
    /// (inline ones step here, within the budget; deferred ones are rung),
    /// and this HCA's own steps while `again`; past the budget, requeued.
    pub(crate) fn run_rest(&self, mut todo: Todo, mut again: bool, flush: bool, mut used: u64) {
        loop {
            while let Some(peer) = todo.pop() {
                if peer.id() == self.id() {
                    again = true;
                } else if !peer.inline() {
                    peer.ring();
                } else if used >= self.budget {
                    peer.requeue();
                } else {
                    let (more, work) = peer.step(&mut todo);
                    used += work;
                    if more {
                        todo.push(peer);
                    }
                }
            }
            if !again {
                return;
            }
            if used >= self.budget {
                self.requeue();
                return;
            }
            let ((), more, work) = self.step(&mut todo, flush, |_| ((), false));
            again = more;
            used += work;
        }
    }

    /// Work is left after a call used its budget: inline, another DPC
    /// ([`crate::SoftBus::resume`]) runs the next budget; deferred, the
    /// firmware's own doorbell.
    pub(crate) fn requeue(&self) {
        match self.execution {
            Execution::Inline => self.bus.resume(),
            Execution::Deferred => self.bus.doorbell(),
        }
    }

    /// Moves the data path's events to their event queues (under
    /// `HCA_LOCK`, see [`SoftHca::queue_events`]); returns whether to raise
    /// EQ 0's interrupt.
    pub(crate) fn push_events(
        &self,
        fw: &mut crate::firmware::Firmware,
        stats: &mut SoftStats,
    ) -> bool {
        if fw.dp.events.is_empty() {
            return false;
        }
        self.queue_events(fw, stats)
    }

    /// Hands the serialized datagrams to their link, in the order they
    /// were serialized, with no soft HCA lock held. One thread transmits
    /// at a time (a combining queue): a thread that finds another
    /// transmitting leaves its batches to it, so the wire sees every QP's
    /// packets in PSN order whichever threads ran the data path.
    pub(crate) fn flush_tx(&self) {
        let take = |q: &mut TxQueue, owner: bool| {
            if q.draining && !owner {
                return None;
            }
            let b = q.batches.pop_front();
            q.draining = b.is_some();
            b
        };
        if !self.tx_pending.load(Ordering::Acquire) {
            return;
        }
        let mut next = self.txq.lock(|q| {
            let b = take(q, false);
            if q.batches.is_empty() && !q.draining {
                self.tx_pending.store(false, Ordering::Release);
            }
            b
        });
        while let Some((link, mut tx, tap)) = next {
            // Batches queued behind it for the same link leave with it.
            self.txq.lock(|q| {
                while let Some((l, _, _)) = q.batches.front() {
                    if !irpverbs_ring::Shared::ptr_eq(l, &link) {
                        break;
                    }
                    if let Some((l, mut more, t)) = q.batches.pop_front() {
                        if !tx.append(&mut more) {
                            // No memory to merge: it leaves on its own,
                            // next (popped, so there is room to put back).
                            q.batches.push_front((l, more, t));
                            break;
                        }
                        q.recycle(more);
                    }
                }
            });
            if let Some(tap) = tap {
                for d in tx.iter() {
                    tap.tap(link::Direction::Sent, &d);
                }
            }
            link.transmit(&tx);
            next = self.txq.lock(|q| {
                q.recycle(tx);
                take(q, true)
            });
        }
    }

    /// The data path's step under `HCA_LOCK`: the inbox, the engine within
    /// its budget, the frames for other HCAs into their inboxes, the
    /// datagrams for the link serialized and queued, the events into the
    /// event queue. Returns (raise the interrupt, work is left).
    fn step_locked(&self, st: &mut HcaState, todo: &mut Todo) -> (bool, bool) {
        {
            if let Some(link) = &st.firmware.dp.link {
                let now = link.now_ns();
                let dp = &mut st.firmware.dp;
                dp.now = dp.now.max(now);
            }
            let fw = &mut st.firmware;
            if self.inbox_pending.swap(false, Ordering::AcqRel) {
                if fw.dp.inbound.is_empty() {
                    self.inbox
                        .lock(|ib| core::mem::swap(ib, &mut fw.dp.inbound));
                } else if !self.inbox.lock(|ib| fw.dp.inbound.append(ib)) {
                    // No memory to merge: the inbox waits for the next
                    // step, when the inbound batch is empty.
                    self.inbox_pending.store(true, Ordering::Release);
                }
            }
            let mut more = fw.run_datapath(REQUESTER_BUDGET);
            let dp = &mut fw.dp;
            for q in &mut dp.outbox {
                if q.batch.is_empty() {
                    continue;
                }
                match q.peer.as_ref().and_then(Weak::upgrade) {
                    Some(peer) => {
                        // An inbox with no memory to grow leaves the
                        // frames here, for the next step (after the peer
                        // drained its inbox).
                        more |= !peer.accept(&mut q.batch);
                        todo.push(peer);
                    }
                    None => {
                        // The HCA went away: the packets are lost, and
                        // unacknowledged ones count as sent.
                        for f in q.batch.frames.drain(..) {
                            if let Frame::Packet {
                                pkt,
                                burst,
                                notify: Some(qpn),
                                ..
                            } = f
                            {
                                let psn = burst.last_psn(pkt.psn);
                                let _ = dp.loopq.push_signal(Frame::Sent { qpn, psn });
                                more = true;
                            }
                        }
                        q.batch.clear();
                        dp.stats.packets_dropped += 1;
                    }
                }
            }
            if !dp.wireq.is_empty() {
                if let Some(link) = dp.link.clone() {
                    let mut tx = core::mem::take(&mut dp.tx);
                    let wireq = core::mem::take(&mut dp.wireq);
                    link::serialize(
                        &wireq,
                        &mut tx,
                        &mut dp.scratch,
                        &mut dp.loopq,
                        dp.udp_port,
                        &mut dp.link_stats,
                    );
                    let mut wireq = wireq;
                    wireq.clear();
                    dp.wireq = wireq;
                    more |= !dp.loopq.is_empty();
                    if tx.is_empty() {
                        dp.tx = tx;
                    } else {
                        // Queued, and a transmitted batch's buffers (when
                        // one is back) for the next step, in one hold.
                        let tap = dp.tap.clone();
                        let (lost, spare) = self.txq.lock(|q| (q.queue(link, tx, tap), q.spare()));
                        dp.link_stats.tx_errors += lost as u64;
                        dp.tx = spare.unwrap_or_default();
                        self.tx_pending.store(true, Ordering::Release);
                    }
                } else {
                    dp.wireq.clear();
                }
            }
            let raise = self.push_events(fw, &mut st.stats);
            (raise, more)
        }
    }
}
