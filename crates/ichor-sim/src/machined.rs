//! MachineService methods that answer alike in maintenance and configured mode: the event
//! stream and reading the boot id (talos-facts §10.2, §10.5). Their roles are checked before
//! they run (`authz`).

use std::pin::Pin;

use ichor_talos::api::common::Data;
use ichor_talos::api::machine::{EventsRequest, ReadRequest};
use tonic::Status;

use crate::events::EventStream;
use crate::network::Shared;

/// Where Linux keeps the id of the current boot, which talosctl reads to see a reboot.
pub(crate) const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// The stream `Read` answers with.
pub(crate) type ReadStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<Data, Status>> + Send>>;

/// `Events`: this boot's log from the requested start.
pub(crate) fn events(shared: &Shared, request: &EventsRequest) -> EventStream {
    crate::events::serve(&shared.boot().0, request)
}

/// `Read`: the boot id file (a random UUID per boot and a newline, as the kernel writes it);
/// the simulator has no other files.
pub(crate) fn read(shared: &Shared, request: &ReadRequest) -> Result<ReadStream, Status> {
    if request.path != BOOT_ID {
        return Err(Status::unimplemented(format!(
            "/machine.MachineService/Read of {:?} is not simulated: the simulator has no file but {BOOT_ID}",
            request.path
        )));
    }
    let boot_id = shared.boot().1;
    let data = Data {
        metadata: None,
        bytes: format!("{boot_id}\n").into_bytes(),
    };
    Ok(Box::pin(tokio_stream::once(Ok(data))))
}
