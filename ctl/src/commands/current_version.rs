//! `jioctl current-version`: print `/current_version`.

use clap::Args;

use crate::context::{Access, Context};
use crate::exit::{self, Failure, Outcome};

#[derive(Args, Debug)]
pub struct CurrentVersion {}

impl CurrentVersion {
    pub async fn run(self, ctx: &Context) -> Outcome {
        let store = ctx.open(Access::Read).await?;
        let Some(kv) = store.get(&ctx.schema().current_version()).await? else {
            return Err(Failure::new(exit::FAILED, "/current_version is not set"));
        };
        match jio_common::values::parse_version(&kv) {
            Ok(Some(v)) if ctx.json => {
                println!(
                    "{}",
                    crate::out::document(serde_json::json!({"current_version": v}))
                );
                Ok(())
            }
            Ok(Some(v)) => {
                println!("{v}");
                Ok(())
            }
            Ok(None) => Err(Failure::new(exit::FAILED, format!("{} is empty", kv.key))),
            Err(e) => Err(Failure::with(exit::SOFTWARE, e.into())),
        }
    }
}
