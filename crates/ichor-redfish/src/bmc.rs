//! [`Bmc`]: the operations on one BMC, each following the service's own links (DSP0266: only
//! the service root's path is fixed) and reading what it may send from the resource first:
//! action targets and allowable values from `Actions`, the version to change from its `ETag`.
//! Each operation is one short series of requests; none waits for the machine to act.

use serde_json::json;

use crate::endpoint::Endpoint;
use crate::error::Error;
use crate::model::{
    ActionInfoDoc, BootEnabled, BootTarget, CollectionDoc, ManagerDoc, ResetType, ServiceRootDoc,
    System, VirtualMedia, check_listed,
};
use crate::transport::Transport;

/// The service root, the one path Redfish fixes.
const SERVICE_ROOT: &str = "/redfish/v1/";
/// The most pages of one collection read.
const MAX_PAGES: usize = 16;
/// The most members of one collection taken.
const MAX_MEMBERS: usize = 1024;
/// The most virtual media devices of one collection looked at for a CD or DVD.
const MAX_MEDIA: usize = 16;

/// A client for one BMC's Redfish service: its own connections, time limits and requests in
/// flight ([`Limits`](crate::Limits)). Cheap to share by reference; calls from many tasks wait
/// for a place in turn.
#[derive(Debug)]
pub struct Bmc {
    transport: Transport,
}

impl Bmc {
    /// A client for `endpoint`, once its URL, trust and limits check out. Nothing is sent yet.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidEndpoint`] when the URL is not an `https` origin (or `http` without the
    /// opt-in), carries credentials or another path than `/redfish/v1`, the CA bundle holds no
    /// certificate, or a limit is zero.
    pub fn new(endpoint: Endpoint) -> Result<Self, Error> {
        Ok(Self {
            transport: Transport::new(endpoint)?,
        })
    }

    /// The endpoint's origin, as errors name it.
    #[must_use]
    pub fn endpoint(&self) -> &str {
        &self.transport.endpoint
    }

    /// The `@odata.id` of each system the service lists (the service root's `Systems`
    /// collection).
    ///
    /// # Errors
    ///
    /// Any of [`Error`]'s request errors.
    pub async fn systems(&self) -> Result<Vec<String>, Error> {
        let answer = self.transport.get(SERVICE_ROOT).await?;
        let root: ServiceRootDoc = self.transport.read(&answer)?;
        let systems = root.systems.ok_or_else(|| Error::Protocol {
            endpoint: self.endpoint().to_owned(),
            path: SERVICE_ROOT.to_owned(),
            detail: "a service root without a Systems link".to_owned(),
        })?;
        self.members(&systems.odata_id).await
    }

    /// The system at `system` (its `@odata.id`).
    ///
    /// # Errors
    ///
    /// Any of [`Error`]'s request errors.
    pub async fn system(&self, system: &str) -> Result<System, Error> {
        let answer = self.transport.get(system).await?;
        System::read(&answer.body, &answer.path, answer.etag)
            .map_err(|unreadable| self.transport.unreadable(system, unreadable))
    }

    /// Resets the system at `system` with `reset`, posted to the target its
    /// `#ComputerSystem.Reset` action names, once the type is among those the service lists
    /// (inline, or in the action's `ActionInfo`); a service that lists none is sent it as is.
    /// Returns once the service took the request, not once the power changed: read
    /// [`System::power_state`] for that.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] when the system has no reset action or does not list `reset`;
    /// any of [`Error`]'s request errors.
    pub async fn reset(&self, system: &str, reset: ResetType) -> Result<(), Error> {
        let read = self.system(system).await?;
        let action = read.reset.ok_or_else(|| {
            self.unsupported(format!("the #ComputerSystem.Reset action on {system}"))
        })?;
        let listed = match (action.allowed, action.action_info) {
            (Some(listed), _) => Some(listed),
            (None, Some(info)) => {
                let answer = self.transport.get(&info).await?;
                self.transport
                    .read::<ActionInfoDoc>(&answer)?
                    .allowed("ResetType")
            }
            (None, None) => None,
        };
        check_listed(reset.as_str(), listed.as_deref()).map_err(|listed| {
            self.unsupported(format!(
                "the reset type {} on {system} (it lists {listed})",
                reset.as_str()
            ))
        })?;
        let body = json!({ "ResetType": reset.as_str() });
        self.transport.post(&action.target, &body).await.map(drop)
    }

    /// Sets the boot source override of the system at `system`: a PATCH of its `Boot`, sent
    /// with `If-Match` when the system has a version (`ETag`), once the target is among those
    /// the service lists.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] when the service does not list `target`; [`Error::Refused`] (412)
    /// when the system changed between the read and the write; any of [`Error`]'s request
    /// errors.
    pub async fn set_boot_override(
        &self,
        system: &str,
        target: BootTarget,
        enabled: BootEnabled,
    ) -> Result<(), Error> {
        let read = self.system(system).await?;
        check_listed(target.as_str(), read.boot.allowed_targets.as_deref()).map_err(|listed| {
            self.unsupported(format!(
                "the boot target {} on {system} (it lists {listed})",
                target.as_str()
            ))
        })?;
        let body = json!({
            "Boot": {
                "BootSourceOverrideTarget": target.as_str(),
                "BootSourceOverrideEnabled": enabled.as_str(),
            }
        });
        self.transport
            .patch(system, &body, read.etag.as_deref())
            .await
            .map(drop)
    }

    /// The first CD or DVD virtual media device of the system at `system`: among the system's
    /// own `VirtualMedia` collection first, then each of its managers' (`Links.ManagedBy`).
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] when none plays CDs or DVDs; any of [`Error`]'s request errors.
    pub async fn find_optical_media(&self, system: &str) -> Result<VirtualMedia, Error> {
        let read = self.system(system).await?;
        let mut collections: Vec<String> = read.virtual_media.into_iter().collect();
        for manager in &read.managed_by {
            let answer = self.transport.get(manager).await?;
            let doc: ManagerDoc = self.transport.read(&answer)?;
            if let Some(link) = doc.virtual_media
                && !collections.contains(&link.odata_id)
            {
                collections.push(link.odata_id);
            }
        }
        for collection in &collections {
            for member in self.members(collection).await?.iter().take(MAX_MEDIA) {
                let media = self.virtual_media(member).await?;
                if media.is_optical() {
                    return Ok(media);
                }
            }
        }
        Err(self.unsupported(format!("CD or DVD virtual media for {system}")))
    }

    /// The virtual media device at `media` (its `@odata.id`).
    ///
    /// # Errors
    ///
    /// Any of [`Error`]'s request errors.
    pub async fn virtual_media(&self, media: &str) -> Result<VirtualMedia, Error> {
        let answer = self.transport.get(media).await?;
        VirtualMedia::read(&answer.body, &answer.path)
            .map_err(|unreadable| self.transport.unreadable(media, unreadable))
    }

    /// Inserts the image at `image` (a URL the BMC fetches) into the virtual media device at
    /// `media`, inserted and write-protected, through its `#VirtualMedia.InsertMedia` action.
    /// Nothing is sent when that image is inserted already; another image is ejected first.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] when the device offers no insert (or, holding another image, no
    /// eject) action; [`Error::Refused`] when the BMC cannot fetch the image; any of
    /// [`Error`]'s request errors.
    pub async fn insert_media(&self, media: &str, image: &str) -> Result<(), Error> {
        let read = self.virtual_media(media).await?;
        if read.inserted == Some(true) {
            if read.image.as_deref() == Some(image) {
                return Ok(());
            }
            self.eject(&read).await?;
        }
        let target = read.insert_target.ok_or_else(|| {
            self.unsupported(format!("the #VirtualMedia.InsertMedia action on {media}"))
        })?;
        let body = json!({ "Image": image, "Inserted": true, "WriteProtected": true });
        self.transport.post(&target, &body).await.map(drop)
    }

    /// Ejects the image from the virtual media device at `media` through its
    /// `#VirtualMedia.EjectMedia` action; nothing is sent when none is inserted.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] when the device offers no eject action; any of [`Error`]'s
    /// request errors.
    pub async fn eject_media(&self, media: &str) -> Result<(), Error> {
        let read = self.virtual_media(media).await?;
        if read.inserted == Some(false) && read.image.is_none() {
            return Ok(());
        }
        self.eject(&read).await
    }

    async fn eject(&self, media: &VirtualMedia) -> Result<(), Error> {
        let target = media.eject_target.as_deref().ok_or_else(|| {
            self.unsupported(format!(
                "the #VirtualMedia.EjectMedia action on {}",
                media.odata_id
            ))
        })?;
        self.transport.post(target, &json!({})).await.map(drop)
    }

    /// The `@odata.id` of each member of the collection at `collection`, page by page.
    async fn members(&self, collection: &str) -> Result<Vec<String>, Error> {
        let mut members = Vec::new();
        let mut next = Some(collection.to_owned());
        let mut pages = 0;
        while let Some(page) = next.take() {
            pages += 1;
            let answer = self.transport.get(&page).await?;
            let doc: CollectionDoc = self.transport.read(&answer)?;
            members.extend(
                doc.members
                    .unwrap_or_default()
                    .into_iter()
                    .map(|m| m.odata_id),
            );
            if members.len() > MAX_MEMBERS || (doc.next_link.is_some() && pages >= MAX_PAGES) {
                return Err(Error::Protocol {
                    endpoint: self.endpoint().to_owned(),
                    path: collection.to_owned(),
                    detail: format!(
                        "a collection of more than {MAX_MEMBERS} members or {MAX_PAGES} pages"
                    ),
                });
            }
            next = doc.next_link;
        }
        Ok(members)
    }

    fn unsupported(&self, detail: String) -> Error {
        Error::Unsupported {
            endpoint: self.endpoint().to_owned(),
            detail,
        }
    }
}
