//! Scenarios that change files in the session's directory: `save` with the
//! agent's own IO, `fs-save` through the client (`fs/write_text_file`), as
//! an agent at work on a repository does both.

use serde_json::json;

use super::scenarios::{Cancelled, Turn, TurnEnd, END_TURN};

impl Turn {
    /// Scenario `save <name> <text>`: writes `<text>` (and a newline) to
    /// `<cwd>/<name>` itself (its folders made), and says `saved <name>` or
    /// the error.
    pub(super) async fn save(&self, args: &str) -> Result<TurnEnd, Cancelled> {
        let (name, text) = args.split_once(char::is_whitespace).unwrap_or((args, ""));
        let path = self.cwd.join(name);
        let written = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&path, format!("{text}\n")));
        let said = match written {
            Ok(()) => format!("saved {name}"),
            Err(e) => format!("could not save {name}: {e}"),
        };
        self.say(&said).await?;
        Ok(TurnEnd::Stop(END_TURN))
    }

    /// Scenario `fs-save <name> <text>`: asks the client to write `<text>`
    /// (and a newline) to `<cwd>/<name>` (`fs/write_text_file`), and says
    /// `fs-saved <name>` or the client's error.
    pub(super) async fn fs_save(&self, args: &str) -> Result<TurnEnd, Cancelled> {
        let (name, text) = args.split_once(char::is_whitespace).unwrap_or((args, ""));
        let params = json!({
            "sessionId": self.session_id,
            "path": self.cwd.join(name).display().to_string(),
            "content": format!("{text}\n"),
        });
        let (_, answer) = self.wire.request("fs/write_text_file", params).await;
        let said = match answer.await {
            Ok(Ok(_)) => format!("fs-saved {name}"),
            Ok(Err(error)) => format!("could not fs-save {name}: {error:?}"),
            Err(_) => format!("could not fs-save {name}: no answer"),
        };
        self.say(&said).await?;
        Ok(TurnEnd::Stop(END_TURN))
    }
}
