// Follow a conversation live and resume after a drop, in Dart (Flutter or
// the command line). Packages: http, web_socket_channel.
import 'dart:convert';

import 'package:http/http.dart' as http;
import 'package:web_socket_channel/io.dart';

const base = 'https://gateway.example.com';
const token = 'acpgw_...';
final headers = {'Authorization': 'Bearer $token', 'Content-Type': 'application/json'};

/// The newest seq this client has seen; keep it across restarts of the app.
var lastSeq = 0;

Future<void> follow(String conversationId) async {
  final wsBase = base.replaceFirst('http', 'ws');
  final channel = IOWebSocketChannel.connect(
    Uri.parse('$wsBase/api/v1/conversations/$conversationId/ws?after=$lastSeq'),
    headers: {'Authorization': 'Bearer $token'},
  );
  await for (final frame in channel.stream) {
    final event = jsonDecode(frame as String) as Map<String, dynamic>;
    lastSeq = event['seq'] as int; // one more than the last: no gap, no duplicate
    switch (event['type']) {
      case 'permission_requested':
        final request = event['data'] as Map<String, dynamic>;
        final allow = (request['options'] as List)
            .firstWhere((o) => o['kind'] == 'allow_once') as Map<String, dynamic>;
        await http.post(
          Uri.parse('$base/api/v1/permissions/${request['id']}/respond'),
          headers: headers,
          body: jsonEncode({'option_id': allow['optionId']}),
        );
      case 'turn_ended':
        print('turn ended: ${event['data']['stop_reason']}');
    }
  }
  // Closed (4008 too slow, 1001 gateway restart, network): come back with `after`.
  print('socket closed (${channel.closeCode}); resume from seq $lastSeq');
}

Future<void> main() async {
  final created = await http.post(Uri.parse('$base/api/v1/conversations'),
      headers: headers, body: jsonEncode({'agent': 'demo'}));
  final conversation = jsonDecode(created.body) as Map<String, dynamic>;
  final following = follow(conversation['id'] as String);
  await http.post(Uri.parse('$base/api/v1/conversations/${conversation['id']}/prompts'),
      headers: headers, body: jsonEncode({'text': 'tool'}));
  await following;
}
