//! Tagging EC2 resources with user-chosen tags: cloud-provider-aws's `TagResource` and
//! `UntagResource` (AWS-64), the calls of the tagging controller. Unlike upstream, the calls
//! take several resources, so that a batcher (the controller's) can send one request for many
//! instances; the error codes the controller tells apart are [`INSTANCE_NOT_FOUND`] and
//! [`INVALID_ID`].

use std::collections::BTreeMap;

use aws_sdk_ec2::types::Tag;

use crate::{
    AwsCloud,
    api::{AwsApi, AwsError},
};

/// The error code of an instance ID that names no instance. `CreateTags` is eventually
/// consistent: a new instance may answer this for a short while.
pub const INSTANCE_NOT_FOUND: &str = "InvalidInstanceID.NotFound";

/// The error code of an ID that is not a valid instance ID at all (e.g. the fake IDs of KWOK
/// nodes): tagging it never succeeds.
pub const INVALID_ID: &str = "InvalidID";

/// The EC2 client and back-off of one provider, for tagging (cheap to clone, usable from
/// background tasks).
#[derive(Debug, Clone)]
pub struct TagClient {
    api: AwsApi,
    ec2: aws_sdk_ec2::Client,
}

fn ec2_tags(tags: &BTreeMap<String, String>) -> Vec<Tag> {
    tags.iter()
        .map(|(k, v)| Tag::builder().key(k).value(v).build())
        .collect()
}

impl TagClient {
    /// `CreateTags` of `tags` on `resources` (one request; metrics label `create_tags`).
    pub async fn create_tags(
        &self,
        resources: &[String],
        tags: &BTreeMap<String, String>,
    ) -> Result<(), AwsError> {
        self.api
            .call(
                "create_tags",
                self.ec2
                    .create_tags()
                    .set_resources(Some(resources.to_vec()))
                    .set_tags(Some(ec2_tags(tags)))
                    .send(),
            )
            .await
            .map(drop)
    }

    /// `DeleteTags` of `tags` on `resources` (one request; metrics label `delete_tags`). Each
    /// tag is sent with its value, so EC2 removes a tag only where it still has that value: a
    /// tag someone else has changed since is left alone.
    pub async fn delete_tags(
        &self,
        resources: &[String],
        tags: &BTreeMap<String, String>,
    ) -> Result<(), AwsError> {
        self.api
            .call(
                "delete_tags",
                self.ec2
                    .delete_tags()
                    .set_resources(Some(resources.to_vec()))
                    .set_tags(Some(ec2_tags(tags)))
                    .send(),
            )
            .await
            .map(drop)
    }
}

impl AwsCloud {
    /// A client for tagging resources with this provider's EC2 client, back-off and metrics.
    pub fn tag_client(&self) -> TagClient {
        TagClient {
            api: self.api.clone(),
            ec2: self.ec2.clone(),
        }
    }
}
