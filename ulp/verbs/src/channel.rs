//! Completion channels ([`CompChannel`], libibverbs' `ibv_comp_channel`):
//! CQs created on a channel (`IvCreateCqIn::channel`) report their
//! completion events there once armed (`req_notify_cq`, one event per
//! arming); [`CompChannel::get_cq_event`] takes them in order and
//! [`Client::ack_cq_events`] acknowledges them. A CQ with unacknowledged
//! events cannot be destroyed, nor a channel with CQs on it
//! (`STATUS_DEVICE_BUSY`), as in libibverbs.

use irpverbs_abi::*;

use crate::{Client, IoctlResult, call, call_none};

/// A completion channel of a [`Client`]'s file. Dropping it destroys it,
/// ignoring a refusal (the channel then lives until the file is closed).
pub struct CompChannel<'c> {
    client: &'c Client,
    handle: IvHandle,
    destroyed: bool,
}

impl std::fmt::Debug for CompChannel<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompChannel")
            .field("handle", &self.handle)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// `IOCTL_IV_CREATE_CHANNEL` (`ibv_create_comp_channel`).
    ///
    /// # Errors
    /// The create's status (`STATUS_INSUFFICIENT_RESOURCES` past the file's
    /// channel quota).
    pub fn create_comp_channel(&self) -> IoctlResult<CompChannel<'_>> {
        let out: IvCreateChannelOut = call(self, IOCTL_IV_CREATE_CHANNEL, &IvAllocPdIn::default())?;
        Ok(CompChannel {
            client: self,
            handle: out.channel,
            destroyed: false,
        })
    }

    /// `IOCTL_IV_CREATE_CQ` with the whole request (its channel, vector and
    /// user context), without the speed path.
    ///
    /// # Errors
    /// The create's status.
    pub fn create_cq_with(&self, i: &IvCreateCqIn) -> IoctlResult<IvCreateCqOut> {
        call(self, IOCTL_IV_CREATE_CQ, i)
    }

    /// `IOCTL_IV_ACK_CQ_EVENTS` (`ibv_ack_cq_events`): acknowledges `count`
    /// events [`CompChannel::get_cq_event`] returned for `cq`.
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` for zero or more events than were
    /// delivered and not yet acknowledged; `STATUS_INVALID_HANDLE` for a
    /// handle that is not a live CQ of this file. Nothing changes then.
    pub fn ack_cq_events(&self, cq: IvHandle, count: u32) -> IoctlResult<()> {
        call_none(
            self,
            IOCTL_IV_ACK_CQ_EVENTS,
            &IvAckIn {
                handle: cq,
                count,
                event_type: 0,
            },
        )
    }
}

impl CompChannel<'_> {
    /// The channel's handle (for `IvCreateCqIn::channel`).
    #[must_use]
    pub fn handle(&self) -> IvHandle {
        self.handle
    }

    /// `IOCTL_IV_GET_CQ_EVENT` (`ibv_get_cq_event`): the next CQ event,
    /// waiting while there is none. The event counts against its CQ until
    /// acknowledged ([`Client::ack_cq_events`]).
    ///
    /// # Errors
    /// `STATUS_DELETE_PENDING` if the channel is destroyed during the wait,
    /// `STATUS_CANCELLED` if the wait is cancelled, `STATUS_INVALID_HANDLE`
    /// for a destroyed channel.
    pub fn get_cq_event(&self) -> IoctlResult<IvCqEventOut> {
        call(
            self.client,
            IOCTL_IV_GET_CQ_EVENT,
            &IvHandleIn {
                handle: self.handle,
            },
        )
    }

    /// `IOCTL_IV_DESTROY_CHANNEL` (`ibv_destroy_comp_channel`).
    ///
    /// # Errors
    /// The refusal (`STATUS_DEVICE_BUSY` while CQs are on it) and the
    /// channel, unchanged and usable.
    pub fn destroy(mut self) -> Result<(), (Self, NtStatus)> {
        match self.destroy_once() {
            Ok(()) => Ok(()),
            Err(st) => Err((self, st)),
        }
    }

    fn destroy_once(&mut self) -> IoctlResult<()> {
        call_none(
            self.client,
            IOCTL_IV_DESTROY_CHANNEL,
            &IvHandleIn {
                handle: self.handle,
            },
        )?;
        self.destroyed = true;
        Ok(())
    }
}

impl Drop for CompChannel<'_> {
    fn drop(&mut self) {
        if !self.destroyed {
            let _ = self.destroy_once();
        }
    }
}
