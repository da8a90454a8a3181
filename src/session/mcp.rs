//! The MCP servers an ACP client (an IDE at the gateway's `/acp`) gave a
//! conversation, where its agent profile lets them through
//! (`client_mcp_servers`): kept per conversation while the gateway runs,
//! and given to its agent beside the profile's `mcp_servers` each time it
//! starts (`session/new`, `session/load`, `session/resume`), so an agent
//! started again for the next prompt has them too. A client gives them
//! again when it loads or resumes the session after a gateway restart.

use std::collections::HashMap;
use std::sync::Mutex;

use agent_client_protocol_schema::v1::McpServer;
use uuid::Uuid;

use crate::config::AgentProfile;

/// Each conversation's client MCP servers.
#[derive(Default)]
pub(super) struct ClientMcp(Mutex<HashMap<Uuid, Given>>);

struct Given {
    servers: Vec<McpServer>,
    /// Whether an agent was started with these.
    started: bool,
}

impl ClientMcp {
    /// `profile` for the conversation `id`'s agent about to start: its
    /// `mcp_servers` and then the client's.
    pub(super) fn profile(&self, id: Uuid, profile: &AgentProfile) -> AgentProfile {
        let mut profile = profile.clone();
        if let Some(given) = self.0.lock().unwrap().get_mut(&id) {
            profile.mcp_servers.extend(given.servers.iter().cloned());
            given.started = true;
        }
        profile
    }

    /// Records `servers` for `id`; whether the conversation's running
    /// agent (if any) was started with exactly these.
    pub(super) fn give(&self, id: Uuid, servers: Vec<McpServer>) -> bool {
        let mut given = self.0.lock().unwrap();
        match given.get(&id) {
            Some(g) if g.servers == servers => g.started,
            _ if servers.is_empty() => {
                // Nothing to give: as a conversation that never had any.
                given.remove(&id).is_none_or(|g| g.servers.is_empty())
            }
            _ => {
                given.insert(
                    id,
                    Given {
                        servers,
                        started: false,
                    },
                );
                false
            }
        }
    }

    pub(super) fn forget(&self, id: Uuid) {
        self.0.lock().unwrap().remove(&id);
    }
}
