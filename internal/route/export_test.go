package route

// ParseStampCareful is ParseStamp without its fast path, for the fuzz
// target that holds the two to the same answers.
var ParseStampCareful = parseStamp

// ValidPlanName and ValidTopicName are the regular expressions' stand-ins.
var (
	ValidPlanName  = validPlanName
	ValidTopicName = validTopicName
	TopicName      = topicName
)
